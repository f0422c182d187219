//! What the unit tests of several modules share: a TLS handshake between two BoringSSL
//! ends over a pair of connected Unix sockets, each side with its own settings.

use std::os::unix::net::UnixStream;
use std::time::Duration;

/// A connected pair of Unix sockets on which a read or write that waits more than 10 s
/// fails: a side that stalls fails its test instead of hanging it.
pub fn socket_pair() -> (UnixStream, UnixStream) {
    let pair = UnixStream::pair().expect("a socket pair");
    for socket in [&pair.0, &pair.1] {
        let limit = Some(Duration::from_secs(10));
        socket.set_read_timeout(limit).expect("a read timeout");
        socket.set_write_timeout(limit).expect("a write timeout");
    }
    pair
}

/// Runs `on_a_thread` on a thread of its own with one end of a [`socket_pair`] and `here`
/// on this thread with the other (one side of a handshake each, so that neither waits on
/// itself); returns what each returned.
pub fn over_socket_pair<T, H>(
    on_a_thread: impl FnOnce(UnixStream) -> T + Send + 'static,
    here: impl FnOnce(UnixStream) -> H,
) -> (T, H)
where
    T: Send + 'static,
{
    let (theirs, ours) = socket_pair();
    let thread = std::thread::spawn(move || on_a_thread(theirs));
    let here = here(ours);
    (thread.join().expect("the other side's thread"), here)
}
