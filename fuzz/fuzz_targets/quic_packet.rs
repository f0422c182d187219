//! The QUIC packet path before quiche, on arbitrary datagrams from arbitrary addresses, to
//! a socket group of 1 to 64 workers:
//! - the kernel's choice of worker (the reuseport program, run here as the kernel runs
//!   classic BPF) is the worker the endpoint's own reading of the destination connection
//!   ID names, for every packet the endpoint would route to a connection;
//! - a Version Negotiation answer goes only to a datagram that could open a connection,
//!   and is no larger than it;
//! - a Retry is no larger than the Initial it answers, goes back to the client's source
//!   ID, names the worker that sent it, and its token opens for that client and ID only;
//! - a token the datagram carries is refused (only this process can seal one);
//! - a stateless reset is shorter than the packet that drew it and carries its ID's token.
//!
//! Input: byte 0 picks the worker count, bytes 1..7 the client's IPv4 address and port,
//! the rest is the datagram.
#![no_main]

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use libfuzzer_sys::fuzz_target;
use tlsterm::quic::{cid, packet, reset, token};

fuzz_target!(|data: &[u8]| {
    let Some((head, datagram)) = data.split_at_checked(7) else {
        return;
    };
    let workers = 1 + usize::from(head[0] % 64);
    let from = SocketAddr::V4(SocketAddrV4::new(
        Ipv4Addr::new(head[1], head[2], head[3], head[4]),
        u16::from_be_bytes([head[5], head[6]]),
    ));
    let program = tlsterm::sys::steering_program(cid::WORKER_OFFSET as u32, workers as u32);
    let steered = run_classic_bpf(&program, datagram) as usize;

    // The endpoint's own reading, in its order.
    let mut copy = datagram.to_vec();
    let header = match packet::arrival(&mut copy) {
        packet::Arrival::OtherVersion(answer) => {
            assert!(datagram.len() >= packet::MIN_INITIAL_DATAGRAM);
            assert!(
                answer.len() <= datagram.len(),
                "Version Negotiation amplifies"
            );
            return;
        }
        packet::Arrival::Established(dcid) => {
            assert_eq!(
                Some(steered),
                cid::worker_of(&dcid, workers),
                "short header steered elsewhere"
            );
            if let Some(reset) = reset::packet(&dcid, datagram.len()) {
                assert!(
                    reset.len() < datagram.len(),
                    "a reset as long as its trigger"
                );
                assert!(reset.len() >= reset::MIN_RESET);
                assert_eq!(reset[0] & 0xc0, 0x40, "a reset looks like a short header");
                let tail = &reset[reset.len() - 16..];
                assert_eq!(
                    tail,
                    reset::token(&dcid).to_be_bytes(),
                    "a reset without its token"
                );
            }
            return;
        }
        packet::Arrival::Unreadable => return,
        packet::Arrival::Parsed(header) => header,
    };
    assert_eq!(copy, datagram, "reading a datagram changed it");
    if header.ty == quiche::Type::Short {
        return;
    }
    // A long header: the program reads the same ID quiche does, or leaves an ID too short
    // to name a worker to the kernel's hash (an index past the group).
    match cid::worker_of(&header.dcid, workers) {
        Some(worker) => assert_eq!(steered, worker, "long header steered elsewhere"),
        None => assert!(steered >= workers, "a short ID steered to a worker"),
    }
    if let Some(carried) = header.token.as_deref().filter(|t| !t.is_empty()) {
        assert!(
            token::check(carried, from, &header.dcid).is_err(),
            "a forged token opened"
        );
    }
    if header.ty != quiche::Type::Initial || datagram.len() < packet::MIN_INITIAL_DATAGRAM {
        return;
    }
    let worker = steered.min(workers - 1);
    let Ok(mut answer) = packet::retry(&header, from, worker) else {
        return;
    };
    assert!(answer.len() <= datagram.len(), "a Retry amplifies");
    let retry = quiche::Header::from_slice(&mut answer, cid::CID_LEN).expect("a readable Retry");
    assert_eq!(retry.ty, quiche::Type::Retry);
    assert_eq!(
        retry.dcid, header.scid,
        "a Retry to another ID than the client's"
    );
    assert_eq!(cid::worker_of(&retry.scid, workers), Some(worker));
    let issued = retry.token.expect("a Retry carries a token");
    assert_eq!(
        token::check(&issued, from, &retry.scid).ok().as_deref(),
        Some(&header.dcid[..])
    );
    let elsewhere = SocketAddr::new(from.ip(), from.port().wrapping_add(1));
    assert!(
        token::check(&issued, elsewhere, &retry.scid).is_err(),
        "a token opened elsewhere"
    );
});

/// Runs a classic BPF program over `packet` as the kernel runs a reuseport program (the
/// instructions the steering program uses): a load past the end stops it with 0.
fn run_classic_bpf(program: &[libc::sock_filter], packet: &[u8]) -> u32 {
    let mut a: u32 = 0;
    let mut pc = 0;
    loop {
        let op = program[pc];
        let k = op.k as usize;
        pc += 1;
        match u32::from(op.code) {
            code if code == libc::BPF_LD | libc::BPF_B | libc::BPF_ABS => match packet.get(k) {
                Some(&byte) => a = u32::from(byte),
                None => return 0,
            },
            code if code == libc::BPF_LD | libc::BPF_H | libc::BPF_ABS => {
                match packet.get(k..k + 2) {
                    Some(half) => a = u32::from(u16::from_be_bytes([half[0], half[1]])),
                    None => return 0,
                }
            }
            code if code == libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K => {
                pc += usize::from(if a & op.k != 0 { op.jt } else { op.jf });
            }
            code if code == libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K => {
                pc += usize::from(if a >= op.k { op.jt } else { op.jf });
            }
            code if code == libc::BPF_JMP | libc::BPF_JA => pc += k,
            code if code == libc::BPF_ALU | libc::BPF_MOD | libc::BPF_K => a %= op.k,
            code if code == libc::BPF_RET | libc::BPF_A => return a,
            code if code == libc::BPF_RET | libc::BPF_K => return op.k,
            code => panic!("an instruction the steering program does not use: {code:#x}"),
        }
    }
}
