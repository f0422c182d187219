//! BoringSSL's asynchronous private-key hook: every signature of a handshake leaves
//! BoringSSL here and goes to the offload layer; the handshake resumes when it is ready.

use std::sync::Arc;

use boring::ssl::{
    AsyncPrivateKeyMethod, AsyncPrivateKeyMethodError, BoxPrivateKeyMethodFuture, SslRef,
    SslSignatureAlgorithm,
};

use crate::offload::{self, SigningKey};

pub struct OffloadKeyMethod {
    pub key: Arc<SigningKey>,
}

impl AsyncPrivateKeyMethod for OffloadKeyMethod {
    fn sign(
        &self,
        _ssl: &mut SslRef,
        input: &[u8],
        algorithm: SslSignatureAlgorithm,
        _output: &mut [u8],
    ) -> Result<BoxPrivateKeyMethodFuture, AsyncPrivateKeyMethodError> {
        let requested = std::time::Instant::now();
        let pending = offload::sign(self.key.clone(), algorithm, input);
        Ok(Box::pin(async move {
            let result = pending.await;
            super::metrics::record_engine_wait(requested.elapsed());
            let signature = result.map_err(|err| {
                tracing::debug!(error = %err, "private-key operation failed");
                AsyncPrivateKeyMethodError
            })?;
            Ok(Box::new(move |_: &mut SslRef, output: &mut [u8]| {
                let out = output
                    .get_mut(..signature.len())
                    .ok_or(AsyncPrivateKeyMethodError)?;
                out.copy_from_slice(&signature);
                Ok(signature.len())
            }) as _)
        }))
    }

    fn decrypt(
        &self,
        _ssl: &mut SslRef,
        _input: &[u8],
        _output: &mut [u8],
    ) -> Result<BoxPrivateKeyMethodFuture, AsyncPrivateKeyMethodError> {
        // Only ECDHE suites are enabled: RSA key exchange never reaches here.
        Err(AsyncPrivateKeyMethodError)
    }
}
