//! Tells a service manager (systemd with `Type=notify`, or anything that reads
//! `NOTIFY_SOCKET`) where the server is in its life: ready once every listener is open,
//! reloading while a SIGHUP is applied, stopping while it drains. A one-line status says
//! what it serves, or why the last reload was refused. Without `NOTIFY_SOCKET` nothing is
//! sent.

use sd_notify::NotifyState;

/// Every listener is open and serving.
pub(super) fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// A SIGHUP is being applied; `ready` follows, whatever the outcome.
pub(super) fn reloading() {
    // systemd wants the time of the reload with it (Type=notify-reload); others ignore it.
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now]),
        Err(_) => send(&[NotifyState::Reloading]),
    }
}

/// No new connections; open ones drain.
pub(super) fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("draining")]);
}

fn send(states: &[NotifyState]) {
    if let Err(err) = sd_notify::notify(states) {
        // The server serves on without its manager hearing; say so, but do not stop.
        tracing::warn!(error = %err, "cannot notify the service manager (NOTIFY_SOCKET)");
    }
}
