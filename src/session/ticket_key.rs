//! One ticket key: its name and secret halves (zeroized when dropped), and the key file
//! format (`ticket_key_file`, also what Redis holds for shared keys): base64 lines of 80
//! bytes, errors naming the file and the line.

use std::path::Path;

use anyhow::Context as _;
use zeroize::{Zeroize, Zeroizing};

/// Bytes of one key in the key file: name (16), HMAC-SHA256 key (32), AES-256 key (32).
pub const KEY_FILE_ENTRY_LEN: usize = 80;

/// One ticket key. Tickets are AES-256-CBC encrypted and HMAC-SHA256 authenticated (the
/// format BoringSSL writes: name, IV, ciphertext, MAC); the name tells which key made them.
/// The secret halves are boxed: key rings are rebuilt and their vectors grow, and moving a
/// key then copies only pointers, so no unzeroized copy of a secret is left behind.
#[derive(Clone)]
pub struct TicketKey {
    pub name: [u8; 16],
    pub hmac: Box<[u8; 32]>,
    pub aes: Box<[u8; 32]>,
}

impl TicketKey {
    pub fn generate() -> TicketKey {
        let mut bytes = [0u8; KEY_FILE_ENTRY_LEN];
        boring::rand::rand_bytes(&mut bytes).expect("the RNG works");
        let key = TicketKey::from_bytes(&bytes);
        bytes.zeroize();
        key
    }

    /// Name, HMAC key, AES key: the layout of one key-file entry.
    pub fn from_bytes(bytes: &[u8; KEY_FILE_ENTRY_LEN]) -> TicketKey {
        let mut key = TicketKey {
            name: [0; 16],
            hmac: Box::new([0; 32]),
            aes: Box::new([0; 32]),
        };
        key.name.copy_from_slice(&bytes[..16]);
        key.hmac.copy_from_slice(&bytes[16..48]);
        key.aes.copy_from_slice(&bytes[48..]);
        key
    }
}

impl Drop for TicketKey {
    fn drop(&mut self) {
        self.hmac[..].zeroize();
        self.aes[..].zeroize();
    }
}

impl std::fmt::Debug for TicketKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TicketKey({})", hex(&self.name))
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl PartialEq for TicketKey {
    fn eq(&self, other: &TicketKey) -> bool {
        self.name == other.name
    }
}
impl Eq for TicketKey {}

/// Parses a key file: one base64 key of 80 bytes per line; blank lines and lines starting with
/// `#` are skipped. Errors name the file and the line.
pub fn parse_key_file(path: &Path, text: &str) -> anyhow::Result<Vec<TicketKey>> {
    let mut keys: Vec<TicketKey> = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = || format!("{}:{}", path.display(), number + 1);
        // Wiped when dropped, on every path: a line of the wrong length returns early.
        let bytes = boring::base64::decode_block(line)
            .map(Zeroizing::new)
            .map_err(|_| anyhow::anyhow!("{}: ticket key is not valid base64", at()))?;
        anyhow::ensure!(
            bytes.len() == KEY_FILE_ENTRY_LEN,
            "{}: ticket key has {} bytes, expected {KEY_FILE_ENTRY_LEN} (16-byte name, 32-byte HMAC key, 32-byte AES key; e.g. `openssl rand 80 | base64 -w0`)",
            at(),
            bytes.len()
        );
        let key = TicketKey::from_bytes(bytes.as_slice().try_into().expect("80 bytes"));
        drop(bytes);
        anyhow::ensure!(
            !keys.iter().any(|k| k.name == key.name),
            "{}: two ticket keys have the same name (first 16 bytes)",
            at()
        );
        keys.push(key);
    }
    anyhow::ensure!(
        !keys.is_empty(),
        "{}: no ticket key in the file",
        path.display()
    );
    Ok(keys)
}

pub fn read_key_file(path: &Path) -> anyhow::Result<Vec<TicketKey>> {
    let mut text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read ticket key file {}", path.display()))?;
    let keys = parse_key_file(path, &text);
    text.zeroize();
    keys
}
