//! Safe wrappers around the BoringSSL and libc calls that the `boring` crate and the
//! standard library do not offer: the only module of tlsterm (outside the engine crate)
//! that may use `unsafe`. Each wrapper takes safe Rust types, so that the callers need no
//! `unsafe` and each contract is checked in one place.
//!
//! Groups: the process and its sockets (libc), settings of a context or a connection,
//! the session hooks (ticket keys, cached sessions), CRLs, and HPKE keys for ECH. One file
//! although it is long: it is the one place a reviewer of `unsafe` has to read.

mod quic;
pub use quic::{builder_sharing, quic_socket, steer_by_connection_id, steering_program};

use std::future::Future;
use std::os::fd::AsRawFd;
use std::os::raw::c_int;
use std::pin::Pin;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use anyhow::Context as _;
use boring::error::ErrorStack;
use boring::hpke::HpkeKey;
use boring::ssl::{BoxGetSessionFinish, SslContextBuilder, SslRef, SslSession};
use boring::x509::store::X509StoreBuilderRef;
use foreign_types::{ForeignType, ForeignTypeRef};
use zeroize::Zeroizing;

// ---- The process and its sockets ----

/// CPU time of the calling thread, in seconds; `None` if the clock cannot be read.
pub fn thread_cpu_seconds() -> Option<f64> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer to a local.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) } != 0 {
        return None;
    }
    Some(now.tv_sec as f64 + now.tv_nsec as f64 * 1e-9)
}

/// Connections waiting in a listening socket's accept queue (Linux reports it as
/// `tcpi_unacked` of TCP_INFO for a socket in LISTEN state); 0 if it cannot tell.
pub fn accept_queue_len(socket: &impl AsRawFd) -> usize {
    // SAFETY: tcp_info is plain integers, for which all-zero bytes are a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: the descriptor is a live socket owned by `socket`; getsockopt writes at most
    // `len` bytes into `info`, a local of that size, and updates `len`.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        info.tcpi_unacked as usize
    } else {
        0
    }
}

/// What BoringSSL (which allocates with the C library's malloc, not tlsterm's allocator)
/// freed, the previous contexts after a reload, connection state after a burst of
/// connections, stays in glibc's arenas unless it is asked to give it back.
pub fn release_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free heap pages to the kernel; it touches no live
    // allocation and is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A non-blocking listening socket with SO_REUSEADDR (a restart binds at once although
/// connections of the previous process linger in TIME_WAIT), a queue with room for a burst
/// of connections, and with `reuse_port` SO_REUSEPORT (so that every worker can have its
/// own socket of one address and the kernel spreads connections over them).
pub fn listening_socket(
    address: std::net::SocketAddr,
    reuse_port: bool,
) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(
        Domain::for_address(address),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(reuse_port)?;
    socket.set_nonblocking(true)?;
    socket.bind(&address.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

// ---- Settings of a context or a connection ----

/// Lets a context accept TLS 1.3 early data (0-RTT).
pub fn enable_early_data(builder: &mut SslContextBuilder) {
    // SAFETY: the builder's SSL_CTX is valid; the call sets a flag.
    unsafe { boring_sys::SSL_CTX_set_early_data_enabled(builder.as_ptr(), 1) };
}

/// Refuses early data on one connection (the context may allow it).
pub fn disable_early_data(ssl: &mut SslRef) {
    // SAFETY: the connection is valid; the call sets a flag.
    unsafe { boring_sys::SSL_set_early_data_enabled(ssl.as_ptr(), 0) };
}

/// Hands BoringSSL precomputed parts of this handshake (a DER `HandshakeHints`, see
/// `tls::key_share_hint`). Only while the ClientHello is being processed; false when
/// BoringSSL refuses the encoding or the moment.
pub fn set_handshake_hints(ssl: &mut SslRef, hints: &[u8]) -> bool {
    // SAFETY: the connection is valid and `hints` is a live slice of `hints.len()` bytes,
    // which BoringSSL copies before returning.
    unsafe { boring_sys::SSL_set_handshake_hints(ssl.as_ptr(), hints.as_ptr(), hints.len()) == 1 }
}

/// Whether the handshake is complete: the client's Finished has been read.
pub fn handshake_confirmed(ssl: &SslRef) -> bool {
    // SAFETY: the connection is valid; the call only reads its state.
    unsafe { boring_sys::SSL_in_init(ssl.as_ptr()) == 0 }
}

/// Whether the handshake is paused on one of tlsterm's asynchronous callbacks (a session
/// looked up, the certificate selected with its key share, a signature): it goes on when
/// that work wakes the connection's task, not when the peer sends more.
pub fn handshake_waits_for_callback(ssl: &SslRef) -> bool {
    // SAFETY: the connection is valid; the call only reads its state.
    let waiting_for = unsafe { boring_sys::SSL_want(ssl.as_ptr()) };
    matches!(
        waiting_for,
        boring_sys::SSL_ERROR_PENDING_SESSION
            | boring_sys::SSL_ERROR_PENDING_CERTIFICATE
            | boring_sys::SSL_ERROR_WANT_PRIVATE_KEY_OPERATION
            | boring_sys::SSL_ERROR_PENDING_TICKET
    )
}

/// Why early data was accepted or refused, with BoringSSL's name for the reason.
pub fn early_data_reason(
    ssl: &SslRef,
) -> (boring_sys::ssl_early_data_reason_t, Option<&'static str>) {
    // SAFETY: the connection is valid; both calls only read its state, and the reason
    // string, when not null, is a static NUL-terminated ASCII string.
    unsafe {
        let reason = boring_sys::SSL_get_early_data_reason(ssl.as_ptr());
        let text = boring_sys::SSL_early_data_reason_string(reason);
        let text = (!text.is_null())
            .then(|| std::ffi::CStr::from_ptr(text).to_str().ok())
            .flatten();
        (reason, text)
    }
}

/// Sets the TLS 1.3 suites of a context: protocol IDs, and per suite the flag marking
/// "equal preference with the next". (The `boring` crate has no wrapper for this call.)
pub fn set_tls13_ciphers(builder: &mut SslContextBuilder, ids: &[u16], flags: &[u32]) -> bool {
    assert_eq!(ids.len(), flags.len());
    // SAFETY: the SSL_CTX is valid; both arrays hold `ids.len()` elements and BoringSSL
    // copies them.
    unsafe {
        boring_sys::SSL_CTX_set1_tls13_ciphers(
            builder.as_ptr(),
            ids.as_ptr(),
            flags.as_ptr(),
            ids.len(),
        ) == 1
    }
}

/// As [`set_tls13_ciphers`], for one connection.
pub fn set_connection_tls13_ciphers(ssl: &mut SslRef, ids: &[u16], flags: &[u32]) -> bool {
    assert_eq!(ids.len(), flags.len());
    // SAFETY: as above, for the connection's own copy of the list.
    unsafe {
        boring_sys::SSL_set1_tls13_ciphers(ssl.as_ptr(), ids.as_ptr(), flags.as_ptr(), ids.len())
            == 1
    }
}

/// Sets the session ID context of one connection (at most 32 bytes).
pub fn set_connection_session_id_context(ssl: &mut SslRef, context: &[u8]) -> bool {
    // SAFETY: the connection is valid; BoringSSL copies the bytes, refusing more than 32.
    unsafe {
        boring_sys::SSL_set_session_id_context(ssl.as_ptr(), context.as_ptr(), context.len()) == 1
    }
}

/// How long a session (ticket, cached ID, TLS 1.3 resumption with key exchange) lasts.
pub fn set_session_lifetime(builder: &mut SslContextBuilder, seconds: u32) {
    // SAFETY: `builder.as_ptr()` is a valid SSL_CTX owned by the builder; these setters only
    // store integers in it.
    unsafe {
        boring_sys::SSL_CTX_set_timeout(builder.as_ptr(), seconds);
        boring_sys::SSL_CTX_set_session_psk_dhe_timeout(builder.as_ptr(), seconds);
    }
}

/// How many TLS 1.3 tickets (NewSessionTicket messages) a server context sends after each
/// handshake; 0 sends none. BoringSSL caps the number at [`MAX_TLS13_TICKETS`].
pub fn set_tls13_ticket_count(builder: &mut SslContextBuilder, count: u8) {
    // SAFETY: `builder.as_ptr()` is a valid SSL_CTX owned by the builder; the setter only
    // stores the (capped) number in it and always succeeds.
    unsafe { boring_sys::SSL_CTX_set_num_tickets(builder.as_ptr(), usize::from(count)) };
}

/// The most tickets BoringSSL sends after one handshake (`kMaxTickets`, ssl/internal.h):
/// it silently lowers a larger count to this.
pub const MAX_TLS13_TICKETS: u8 = 16;

// ---- Session hooks ----

/// A serialized TLS 1.2 session. It holds the session's master secret, so its bytes are
/// wiped when its last holder (the cache, a lookup in flight) lets it go.
pub type SessionDer = Arc<Zeroizing<Vec<u8>>>;

/// A session being looked up (in Redis): its bytes, or `None` if there is none.
pub type PendingSession = Pin<Box<dyn Future<Output = Option<SessionDer>> + Send>>;

/// Installs the lookup of cached sessions by ID (TLS 1.2): `lookup` answers `None` at
/// once for a miss, or a future while the handshake waits (the worker does not).
pub fn set_session_lookup<F>(builder: &mut SslContextBuilder, lookup: F)
where
    F: Fn(&[u8]) -> Option<PendingSession> + Send + Sync + 'static,
{
    // SAFETY: every session handed back is deserialized here from bytes, hence associated
    // with no context at all (the requirement is: not with a different context).
    unsafe {
        builder.set_async_get_session_callback(move |_ssl, id| {
            let pending = lookup(id)?;
            Some(Box::pin(async move {
                let der = pending.await?;
                let finish: BoxGetSessionFinish =
                    Box::new(move |_ssl, _id| SslSession::from_der(&der).ok());
                Some(finish)
            }))
        });
    }
}

/// The name of a session ticket key: the first 16 bytes of a ticket.
pub const TICKET_KEY_NAME_LEN: usize = 16;
const TICKET_IV_LEN: usize = 16; // AES-CBC; BoringSSL's buffer is EVP_MAX_IV_LENGTH (16).

/// The secrets of one ticket key: AES-256-CBC seals the ticket, HMAC-SHA256 signs it.
pub struct TicketSecrets<'a> {
    pub aes: &'a [u8; 32],
    pub hmac: &'a [u8; 32],
}

/// BoringSSL's question to the ticket key hook.
pub enum TicketKeyRequest {
    /// A new ticket is to be sealed.
    Seal(SealTicket),
    /// A presented ticket is to be opened.
    Open(OpenTicket),
}

/// What the hook tells BoringSSL; made only by [`TicketKeyAnswer::NONE`] and the methods
/// of the requests.
pub struct TicketKeyAnswer(c_int);

impl TicketKeyAnswer {
    /// No key: send no ticket, or do not resume (full handshake).
    pub const NONE: TicketKeyAnswer = TicketKeyAnswer(0);
    /// The crypto setup failed: the handshake is aborted.
    const FAILED: TicketKeyAnswer = TicketKeyAnswer(-1);
}

/// The buffers and contexts BoringSSL passes to the hook for one ticket.
struct TicketBuffers {
    key_name: *mut u8,
    iv: *mut u8,
    cipher: *mut boring_sys::EVP_CIPHER_CTX,
    hmac: *mut boring_sys::HMAC_CTX,
}

impl TicketBuffers {
    /// Keys the ticket's AES-256-CBC (to seal or to open) and HMAC-SHA256.
    fn init_crypto(&self, secrets: &TicketSecrets<'_>, seal: bool) -> bool {
        // SAFETY: the contexts and `iv` are valid for the duration of the hook (BoringSSL
        // owns them; the requests holding them do not outlive the hook); the key slices
        // outlive the calls and BoringSSL copies them.
        unsafe {
            boring_sys::EVP_CipherInit_ex(
                self.cipher,
                boring_sys::EVP_aes_256_cbc(),
                ptr::null_mut(),
                secrets.aes.as_ptr(),
                self.iv,
                c_int::from(seal),
            ) == 1
                && boring_sys::HMAC_Init_ex(
                    self.hmac,
                    secrets.hmac.as_ptr().cast(),
                    secrets.hmac.len(),
                    boring_sys::EVP_sha256(),
                    ptr::null_mut(),
                ) == 1
        }
    }
}

/// A ticket to seal: the hook names the key.
pub struct SealTicket(TicketBuffers);

impl SealTicket {
    /// Seals with this key: writes its name and a random IV and keys the crypto.
    pub fn with_key(
        self,
        name: &[u8; TICKET_KEY_NAME_LEN],
        secrets: &TicketSecrets<'_>,
    ) -> TicketKeyAnswer {
        let buffers = &self.0;
        // SAFETY: BoringSSL passes a 16-byte key-name buffer and an IV buffer of
        // EVP_MAX_IV_LENGTH (16) bytes, both writable, for the duration of the hook.
        let ok = unsafe {
            ptr::copy_nonoverlapping(name.as_ptr(), buffers.key_name, TICKET_KEY_NAME_LEN);
            boring_sys::RAND_bytes(buffers.iv, TICKET_IV_LEN) == 1
        };
        match ok && buffers.init_crypto(secrets, true) {
            true => TicketKeyAnswer(1),
            false => TicketKeyAnswer::FAILED,
        }
    }
}

/// A presented ticket: the hook finds its key by name.
pub struct OpenTicket(TicketBuffers);

impl OpenTicket {
    /// The name of the key the ticket was sealed with.
    pub fn key_name(&self) -> &[u8] {
        // SAFETY: in decrypt mode the name buffer holds the ticket's 16-byte key name,
        // valid for the duration of the hook, which this request does not outlive.
        unsafe { std::slice::from_raw_parts(self.0.key_name, TICKET_KEY_NAME_LEN) }
    }

    /// Opens with this key; `renew`: the key is an older one, so a fresh ticket is issued.
    pub fn with_key(self, secrets: &TicketSecrets<'_>, renew: bool) -> TicketKeyAnswer {
        match self.0.init_crypto(secrets, false) {
            true => TicketKeyAnswer(if renew { 2 } else { 1 }),
            false => TicketKeyAnswer::FAILED,
        }
    }
}

/// Answers BoringSSL's ticket key requests, on every worker. A type rather than a
/// closure, because the hook is a plain C function with no place for captured state.
pub trait TicketKeyHook {
    fn answer(request: TicketKeyRequest) -> TicketKeyAnswer;
}

/// Installs `H` as the context's ticket key hook (SSL_CTX_set_tlsext_ticket_key_cb).
pub fn set_ticket_key_hook<H: TicketKeyHook>(builder: &mut SslContextBuilder) -> bool {
    // SAFETY: `ticket_key_callback::<H>` follows the SSL_CTX_set_tlsext_ticket_key_cb
    // contract: in encrypt mode it writes the 16-byte key name and a 16-byte IV and
    // initialises the cipher context (AES-256-CBC) and HMAC context (SHA-256) with the same
    // key; in decrypt mode it reads the name, initialises both contexts with the IV
    // BoringSSL passes, and returns 0 for an unknown key. It never unwinds.
    unsafe {
        boring_sys::SSL_CTX_set_tlsext_ticket_key_cb(
            builder.as_ptr(),
            Some(ticket_key_callback::<H>),
        ) == 1
    }
}

/// BoringSSL's ticket key callback: 1 (sealed, or opened with the current key), 2 (opened
/// with an older key: resume and issue a fresh ticket), 0 (no key: no ticket, or a full
/// handshake), -1 (crypto setup failed: abort).
unsafe extern "C" fn ticket_key_callback<H: TicketKeyHook>(
    _ssl: *mut boring_sys::SSL,
    key_name: *mut u8,
    iv: *mut u8,
    cipher: *mut boring_sys::EVP_CIPHER_CTX,
    hmac: *mut boring_sys::HMAC_CTX,
    encrypt: c_int,
) -> c_int {
    let buffers = TicketBuffers {
        key_name,
        iv,
        cipher,
        hmac,
    };
    let request = match encrypt {
        1 => TicketKeyRequest::Seal(SealTicket(buffers)),
        _ => TicketKeyRequest::Open(OpenTicket(buffers)),
    };
    // A panic must not cross into C: treat it as "no ticket" / "unknown ticket".
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| H::answer(request)))
        .unwrap_or(TicketKeyAnswer::NONE)
        .0
}

// ---- CRLs ----

/// One parsed CRL; we hold one reference and free it on drop.
#[derive(Debug)]
pub struct Crl(NonNull<boring_sys::X509_CRL>);

// SAFETY: BoringSSL computes a CRL's cached extension data while decoding it, and its
// one later change (sorting the revoked entries on first lookup) takes BoringSSL's own
// lock (g_crl_sort_lock in x_crl.cc, checked in boring-sys 5.4); its reference count is
// atomic. So reading it and adding it to stores is safe from
// any thread, which is how verifications on every worker share the CRLs of a store.
unsafe impl Send for Crl {}
// SAFETY: as for Send: shared access only reads.
unsafe impl Sync for Crl {}

impl Drop for Crl {
    fn drop(&mut self) {
        // SAFETY: the pointer came from a successful parse and this is its only owner; a
        // store that was given the CRL holds its own reference.
        unsafe { boring_sys::X509_CRL_free(self.0.as_ptr()) }
    }
}

/// Whether a CRL applies now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrlValidity {
    Current,
    /// nextUpdate is past.
    Expired,
    /// lastUpdate is in the future.
    NotYetValid,
}

impl Crl {
    /// Up to `count` PEM CRLs from `data`, in order; it stops at the first that does not
    /// parse (BoringSSL's error queue then says why).
    pub fn parse_pem(data: &[u8], count: usize) -> anyhow::Result<Vec<Crl>> {
        let len = data.len().try_into().context("CRL file too large")?;
        // SAFETY: the BIO reads `data`, which outlives it (it is freed below).
        let bio = unsafe { boring_sys::BIO_new_mem_buf(data.as_ptr().cast(), len) };
        anyhow::ensure!(!bio.is_null(), "out of memory");
        let mut crls = Vec::with_capacity(count);
        for _ in 0..count {
            // SAFETY: `bio` is valid; no password callback (a CRL is not encrypted).
            let crl = unsafe {
                boring_sys::PEM_read_bio_X509_CRL(bio, ptr::null_mut(), None, ptr::null_mut())
            };
            match NonNull::new(crl) {
                Some(crl) => crls.push(Crl(crl)),
                None => break,
            }
        }
        // SAFETY: `bio` came from BIO_new_mem_buf and is not used afterwards.
        unsafe { boring_sys::BIO_free(bio) };
        Ok(crls)
    }

    /// One DER CRL, and how many bytes of `data` it took.
    pub fn parse_der(data: &[u8]) -> anyhow::Result<(Crl, usize)> {
        let len = data.len().try_into().context("CRL file too large")?;
        let mut cursor = data.as_ptr();
        // SAFETY: d2i reads at most `len` bytes from `cursor` and advances it past what it read.
        let crl = unsafe { boring_sys::d2i_X509_CRL(ptr::null_mut(), &mut cursor, len) };
        let crl = NonNull::new(crl)
            .map(Crl)
            .ok_or_else(ErrorStack::get)
            .context("neither a PEM (BEGIN X509 CRL) nor a DER CRL")?;
        Ok((crl, cursor as usize - data.as_ptr() as usize))
    }

    pub fn validity(&self) -> CrlValidity {
        let crl = self.0.as_ptr();
        // -1: past, 1: future, 0: unreadable.
        let compare = |time: *const boring_sys::ASN1_TIME| {
            // SAFETY: a non-null time from the CRL lives as long as the CRL; this only reads it.
            (!time.is_null()).then(|| unsafe { boring_sys::X509_cmp_current_time(time) })
        };
        // SAFETY: `crl` is valid; the getters return pointers into it, or null.
        let (last, next) = unsafe {
            (
                boring_sys::X509_CRL_get0_lastUpdate(crl),
                boring_sys::X509_CRL_get0_nextUpdate(crl),
            )
        };
        match (compare(last), compare(next)) {
            (_, Some(-1)) => CrlValidity::Expired,
            (Some(1), _) => CrlValidity::NotYetValid,
            _ => CrlValidity::Current,
        }
    }

    pub fn same_issuer(&self, other: &Crl) -> bool {
        // SAFETY: both CRLs are valid; their issuer names live as long as they do and are
        // only read.
        unsafe {
            boring_sys::X509_NAME_cmp(
                boring_sys::X509_CRL_get_issuer(self.0.as_ptr()),
                boring_sys::X509_CRL_get_issuer(other.0.as_ptr()),
            ) == 0
        }
    }

    /// Adds the CRL to a store (which takes its own reference).
    pub fn add_to(&self, store: &mut X509StoreBuilderRef) -> Result<(), ErrorStack> {
        // SAFETY: both pointers are valid; the store takes its own reference to the CRL.
        let added = unsafe { boring_sys::X509_STORE_add_crl(store.as_ptr(), self.0.as_ptr()) };
        match added {
            1 => Ok(()),
            _ => Err(ErrorStack::get()),
        }
    }
}

// ---- HPKE keys for Encrypted Client Hello ----

/// An X25519 HPKE key from its private half.
pub fn hpke_x25519_key(private: &[u8]) -> anyhow::Result<HpkeKey> {
    // SAFETY: EVP_HPKE_KEY_new returns an owned, zeroed key or null (checked); init reads
    // `private.len()` bytes; on success the key is handed to HpkeKey, which frees it.
    unsafe {
        let key = boring_sys::EVP_HPKE_KEY_new();
        anyhow::ensure!(!key.is_null(), "out of memory");
        let kem = boring_sys::EVP_hpke_x25519_hkdf_sha256();
        if boring_sys::EVP_HPKE_KEY_init(key, kem, private.as_ptr(), private.len()) != 1 {
            boring_sys::EVP_HPKE_KEY_free(key);
            anyhow::bail!("not an X25519 HPKE private key");
        }
        Ok(HpkeKey::from_ptr(key))
    }
}

/// The ECHConfig for `key` with this id and public name.
pub fn marshal_ech_config(
    key: &HpkeKey,
    config_id: u8,
    public_name: &str,
) -> anyhow::Result<Vec<u8>> {
    let name = std::ffi::CString::new(public_name).context("public name has a NUL byte")?;
    let mut out: *mut u8 = ptr::null_mut();
    let mut len = 0usize;
    // SAFETY: the key and name are valid for the call; on success BoringSSL allocates
    // `len` bytes at `out`, copied here and then freed with OPENSSL_free.
    unsafe {
        let ok = boring_sys::SSL_marshal_ech_config(
            &mut out,
            &mut len,
            config_id,
            key.as_ptr(),
            name.as_ptr(),
            0,
        );
        anyhow::ensure!(ok == 1 && !out.is_null(), "cannot make the ECHConfig");
        let config = std::slice::from_raw_parts(out, len).to_vec();
        boring_sys::OPENSSL_free(out.cast());
        Ok(config)
    }
}

// ---- Memory of established connections ----

/// Lets BoringSSL free the connection's copy of its context's settings (certificate and
/// key references, cipher, group and ALPN lists, verification settings) as soon as the
/// handshake has completed, TLS 1.3 tickets sent. Afterwards the calls that read settings
/// (such as `SSL_get_certificate` or `SSL_get_ciphers`) answer nothing, while those that
/// read what the handshake negotiated (version, cipher, ALPN, SNI, the client's
/// certificate, early data) answer as before. Only for a server: a client may renegotiate,
/// which needs the settings (BoringSSL then keeps them anyway).
pub fn shed_handshake_config(ssl: &mut SslRef) {
    // SAFETY: the connection is valid; the call sets a flag that BoringSSL reads when the
    // handshake ends.
    unsafe { boring_sys::SSL_set_shed_handshake_config(ssl.as_ptr(), 1) };
}
