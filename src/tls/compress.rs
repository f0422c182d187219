//! Certificate compression (RFC 8879, TLS 1.3): the server's Certificate message sent
//! brotli- or zlib-compressed to clients that offer it, which saves a round trip on
//! slow-start-limited first flights (an RSA chain with its intermediate is ~3 KB).
//!
//! BoringSSL asks for the compression on every handshake and keeps nothing; each
//! certificate context here keeps its compressed messages (one per distinct input: with
//! or without an OCSP staple, for instance), so a chain is compressed once, at the best
//! ratio, and then copied.

use std::io::{self, Write};
use std::marker::PhantomData;
use std::sync::Arc;

use arc_swap::ArcSwap;
use boring::ssl::{CertificateCompressionAlgorithm, CertificateCompressor, SslContextBuilder};

use crate::config::CertCompression;

/// Registers `algorithms` on a certificate's context, the first preferred (a client that
/// offers several gets the first of these it offers).
pub fn install(
    builder: &mut SslContextBuilder,
    algorithms: &[CertCompression],
) -> anyhow::Result<()> {
    for algorithm in algorithms {
        match algorithm {
            CertCompression::Brotli => {
                builder.add_certificate_compression_algorithm(Cached::<Brotli>::default())?
            }
            CertCompression::Zlib => {
                builder.add_certificate_compression_algorithm(Cached::<Zlib>::default())?
            }
        }
    }
    Ok(())
}

/// One compression format.
trait Codec: Send + Sync + 'static {
    const ALGORITHM: CertificateCompressionAlgorithm;
    /// The metric label.
    const LABEL: &'static str;
    fn compress(input: &[u8]) -> io::Result<Vec<u8>>;
}

struct Brotli;

impl Codec for Brotli {
    const ALGORITHM: CertificateCompressionAlgorithm = CertificateCompressionAlgorithm::BROTLI;
    const LABEL: &'static str = "brotli";

    fn compress(input: &[u8]) -> io::Result<Vec<u8>> {
        // Quality 11 (the best): it runs once per certificate. The window is the smallest
        // that holds the whole message: a client's decoder allocates its ring buffer by
        // the window the stream declares, so a 2^22 window costs every client a 4 MiB
        // allocation and clearing per handshake for a message of a few kilobytes.
        let mut out = Vec::with_capacity(input.len());
        {
            let lgwin = brotli_window_bits(input.len());
            let mut writer = brotli::CompressorWriter::new(&mut out, 4096, 11, lgwin);
            writer.write_all(input)?;
            writer.flush()?;
        }
        Ok(out)
    }
}

/// The smallest brotli window (log2, 10 to 24) that covers `len` bytes: brotli's window
/// is 2^bits - 16 bytes.
fn brotli_window_bits(len: usize) -> u32 {
    (10..24)
        .find(|bits| (1usize << bits) - 16 >= len)
        .unwrap_or(24)
}

struct Zlib;

impl Codec for Zlib {
    const ALGORITHM: CertificateCompressionAlgorithm = CertificateCompressionAlgorithm::ZLIB;
    const LABEL: &'static str = "zlib";

    fn compress(input: &[u8]) -> io::Result<Vec<u8>> {
        let mut writer = flate2::write::ZlibEncoder::new(
            Vec::with_capacity(input.len()),
            flate2::Compression::best(),
        );
        writer.write_all(input)?;
        writer.finish()
    }
}

/// At most this many compressed messages per certificate and algorithm: the message
/// differs with and without an OCSP staple, and each refreshed staple makes a new one.
const CACHED_MESSAGES: usize = 4;

struct Compressed {
    input: Box<[u8]>,
    output: Box<[u8]>,
}

/// A codec with the messages it compressed for one certificate context, newest first.
/// Read without a lock by every worker; a miss compresses and publishes a new list.
struct Cached<C> {
    messages: ArcSwap<Vec<Arc<Compressed>>>,
    codec: PhantomData<C>,
}

impl<C> Default for Cached<C> {
    fn default() -> Self {
        Cached {
            messages: ArcSwap::from_pointee(Vec::new()),
            codec: PhantomData,
        }
    }
}

impl<C: Codec> Cached<C> {
    fn get(&self, input: &[u8]) -> io::Result<Arc<Compressed>> {
        if let Some(hit) = self.messages.load().iter().find(|m| *m.input == *input) {
            return Ok(hit.clone());
        }
        let fresh = Arc::new(Compressed {
            input: input.into(),
            output: C::compress(input)?.into(),
        });
        // Two workers may both miss and compress: harmless, and the list stays bounded.
        self.messages.rcu(|messages| {
            let mut updated = Vec::with_capacity(CACHED_MESSAGES);
            updated.push(fresh.clone());
            updated.extend(
                messages
                    .iter()
                    .filter(|m| m.input != fresh.input)
                    .take(CACHED_MESSAGES - 1)
                    .cloned(),
            );
            updated
        });
        Ok(fresh)
    }
}

impl<C: Codec> CertificateCompressor for Cached<C> {
    const ALGORITHM: CertificateCompressionAlgorithm = C::ALGORITHM;
    const CAN_COMPRESS: bool = true;
    const CAN_DECOMPRESS: bool = false;

    fn compress<W: Write>(&self, input: &[u8], output: &mut W) -> io::Result<()> {
        let compressed = self.get(input)?;
        output.write_all(&compressed.output)?;
        super::metrics::record_certificate_compressed(C::LABEL);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decompress_zlib(data: &[u8]) -> Vec<u8> {
        use std::io::Read;
        let mut out = Vec::new();
        flate2::read::ZlibDecoder::new(data)
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    #[test]
    fn compressed_once_per_input_and_bounded() {
        let cache = Cached::<Zlib>::default();
        let message = b"certificate message ".repeat(50);
        let first = cache.get(&message).unwrap();
        assert!(first.output.len() < message.len() / 4);
        assert_eq!(decompress_zlib(&first.output), message);
        // The same input is served from the cache: the very same buffer.
        assert!(Arc::ptr_eq(&first, &cache.get(&message).unwrap()));
        for n in 0..10u8 {
            cache.get(&[n; 64]).unwrap();
        }
        assert_eq!(cache.messages.load().len(), CACHED_MESSAGES);
        assert!(!Arc::ptr_eq(&first, &cache.get(&message).unwrap()));
    }

    /// The window a brotli stream declares in its first bits (RFC 7932, 9.1).
    fn declared_window_bits(stream: &[u8]) -> u32 {
        let bits = u32::from(stream[0]);
        if bits & 1 == 0 {
            return 16;
        }
        match (bits >> 1) & 7 {
            0 => match (bits >> 4) & 7 {
                0 => 17,
                m => 8 + m,
            },
            n => 17 + n,
        }
    }

    #[test]
    fn a_compressed_certificate_declares_a_window_no_larger_than_itself() {
        for (len, bits) in [(500, 10), (1008, 10), (1009, 11), (3_000, 12), (60_000, 16)] {
            let message: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let compressed = Brotli::compress(&message).unwrap();
            assert_eq!(declared_window_bits(&compressed), bits, "{len} bytes");
            let mut out = Vec::new();
            brotli::BrotliDecompress(&mut &compressed[..], &mut out).unwrap();
            assert_eq!(out, message);
        }
        assert_eq!(brotli_window_bits(1 << 26), 24);
    }

    #[test]
    fn brotli_round_trips() {
        let message = b"another certificate message ".repeat(40);
        let compressed = Brotli::compress(&message).unwrap();
        let mut out = Vec::new();
        brotli::BrotliDecompress(&mut &compressed[..], &mut out).unwrap();
        assert_eq!(out, message);
        assert!(CertCompression::parse("Brotli") == Some(CertCompression::Brotli));
        assert!(CertCompression::parse("zstd").is_none());
    }
}
