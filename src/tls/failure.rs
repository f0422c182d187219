//! Why a handshake failed, as BoringSSL's codes say it: the reason code (`SSL_R_*`) it
//! left when the handshake step failed, recorded per connection by the info callback,
//! since the handshake error tokio-boring returns shows its error stack only as text.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::LazyLock;

use boring::ex_data::Index;
use boring::ssl::{Ssl, SslContextBuilder, SslInfoCallbackMode, SslRef};

/// The reason code of the connection's failed handshake step; 0 while there is none.
static HANDSHAKE_ERROR: LazyLock<Index<Ssl, AtomicI32>> =
    LazyLock::new(|| Ssl::new_ex_index().expect("an SSL ex_data index"));

/// Records, on every connection of the context, the reason of a failed handshake step.
/// Every context of a listener gets it: the callback of the connection's current context
/// (the certificate's, once switched) is the one BoringSSL calls.
pub(super) fn record_failures(builder: &mut SslContextBuilder) {
    builder.set_info_callback(|ssl, mode, _| {
        // At the end of each handshake step; a step that failed left its reason on the
        // thread's error queue (a step that waits, for the client or a signature, none).
        if mode != SslInfoCallbackMode::ACCEPT_EXIT {
            return;
        }
        if let (Some(reason), Some(slot)) = (
            crate::sys::last_ssl_error_reason(),
            ssl.ex_data(*HANDSHAKE_ERROR),
        ) {
            slot.store(reason, Ordering::Relaxed);
        }
    });
}

/// Gives a new connection its place for the reason.
pub(super) fn prepare(ssl: &mut Ssl) {
    ssl.set_ex_data(*HANDSHAKE_ERROR, AtomicI32::new(0));
}

/// The reason code (`SSL_R_*`) of the connection's failed handshake, if BoringSSL gave one.
pub fn handshake_error_reason(ssl: &SslRef) -> Option<i32> {
    let reason = ssl.ex_data(*HANDSHAKE_ERROR)?.load(Ordering::Relaxed);
    (reason != 0).then_some(reason)
}
