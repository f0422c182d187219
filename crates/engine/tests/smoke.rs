mod common;
use common::*;
use tlsterm_engine::*;

#[test]
fn smoke_raw_2048() {
    let k = &keys(2048)[0];
    let mut rng = Rng(1);
    let mut input = rng.bytes(256);
    input[0] &= 0x3f;
    for kernel in kernels() {
        let r = rsa_private_batch(kernel, &[&k.engine], &[&input]);
        assert_eq!(
            r[0].as_ref().unwrap(),
            &boring_raw(&k.boring, &input),
            "{kernel:?}"
        );
    }
}
