//! What v9, v10, v11 and v12 added, through the built library's C ABI (sock fabric on
//! loopback): the properties each version reports (v12: rail and plane unknown, every byte
//! written over poisoned memory), `size_t` sizes beyond `INT_MAX` reaching the
//! transport intact, receives NCCL marks completion-optional, the traffic class of v10's
//! comm config and v11's context reaching the rail sockets (`IP_TOS`), setNetAttr, and the
//! new entry points' checks of NULL and forged pointers.

mod so;

use nccl_net_abi::common::{
    NCCL_INVALID_ARGUMENT, NCCL_INVALID_USAGE, NCCL_NET_OPTIONAL_RECV_COMPLETION,
    NCCL_NET_TRAFFIC_CLASS_UNDEF, NCCL_REMOTE_ERROR, NCCL_SUCCESS,
};
use nccl_net_abi::v10::NcclNetCommConfigV10;
use nccl_net_loader::{NcclError, NetAttr, NetCtx, PluginV8 as Plugin};
use so::*;
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::time::{Duration, Instant};

fn rc(r: c_int) -> Result<(), NcclError> {
    if r == NCCL_SUCCESS {
        Ok(())
    } else {
        Err(NcclError(r))
    }
}

const INVAL: Result<(), NcclError> = Err(NcclError(NCCL_INVALID_ARGUMENT));

/// A connected pair in context `ctx`.
fn pair_in(p: &Plugin, ctx: &NetCtx) -> (nccl_net_loader::Comm, nccl_net_loader::Comm) {
    let (mut handle, listen) = p.listen_in(ctx, listen_dev()).expect("listen");
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut send, mut recv) = (None, None);
    while send.is_none() || recv.is_none() {
        assert!(Instant::now() < deadline, "handshake did not finish");
        if send.is_none() {
            send = p
                .connect_in(ctx, connect_dev(), &mut handle)
                .expect("connect");
        }
        if recv.is_none() {
            recv = p.accept(&listen).expect("accept");
        }
        std::thread::yield_now();
    }
    p.close_listen(listen).expect("closeListen");
    (send.unwrap(), recv.unwrap())
}

/// Wait (bounded) for a condition that background threads make true.
fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::yield_now();
    }
    f()
}

/// `maxRecvs`: 1 on `sock` with eager sends on (the default: one buffer per receive), else 8.
fn expected_max_recvs() -> i32 {
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let sock = matches!(var("HA_NCCL_FABRIC").as_str(), "" | "sock");
    if sock && var("HA_NCCL_SOCK_EAGER").trim() != "0" {
        1
    } else {
        8
    }
}

/// The properties each version reports: v8's fields everywhere; from v9 no forced flush,
/// one physical device per device, 1 GiB `maxP2pBytes`, 512 MiB `maxCollBytes`; from v11
/// one request per multi-request; v12 rail and plane `NCCL_NET_ID_UNDEF` (the loader reads
/// -1 for older versions, as NCCL's compatibility layer sets them).
fn properties_per_version(abi: Abi) {
    let p = plugin_for(abi);
    let v8 = plugin_for(Abi::V8).properties(0).unwrap();
    let d = p.properties(0).unwrap();
    assert_eq!(
        (&d.name, d.guid, d.ptr_support, d.max_recvs),
        (&v8.name, v8.guid, v8.ptr_support, v8.max_recvs)
    );
    assert_eq!(d.max_recvs, expected_max_recvs());
    assert_eq!(d.force_flush, 0);
    assert_eq!(d.vdevs, vec![0]);
    assert_eq!(d.max_p2p_bytes, 1 << 30);
    assert_eq!(d.max_coll_bytes, 512 << 20);
    assert_eq!(d.max_multi_request_size, 1);
    assert_eq!((d.rail_id, d.plane_id), (-1, -1));
    assert_eq!(d.max_comms, v8.max_comms);
}

/// v9+ sizes are `size_t`: a send of 2 GiB + 8 bytes (not an `int`) against a 16-byte
/// receive reaches the transport with its full size — both requests fail with the size-error
/// kinds and nothing is written — and a receive of 3 GiB (into untouched, lazily allocated
/// memory) takes a 1 MiB message intact. Moving more than 2 GiB for real is left out: on this
/// 2-core machine it would take minutes of debug-build copying; NCCL never sends more than
/// `maxP2pBytes` (1 GiB) in one request anyway.
fn sizes_beyond_int_max_reach_the_transport(abi: Abi) {
    if abi == Abi::V8 {
        println!("v8 sizes are int: nothing beyond INT_MAX to check");
        return;
    }
    if on_verbs() {
        println!("SKIPPED on verbs: registering 3 GiB would pin it");
        return;
    }
    let p = plugin_for(abi);
    let (send, recv, _) = connect_pair(p);
    let big = (1usize << 31) + 8;
    // calloc'd: the pages are never touched (nothing is written into them).
    let mut sbuf = RegBuf::new(p, &send, vec![0u8; big]);
    let mut small = RegBuf::new(p, &recv, vec![0xaa; 16]);
    let (sp, rp) = (sbuf.ptr(), small.ptr());
    let rr = p
        .irecv_sized(&recv, &[rp], &[16], &[1], &[small.mr()], false)
        .unwrap()
        .unwrap();
    let sr = until_some(|| p.isend_sized(&send, sp, big, 1, sbuf.mr()).unwrap());
    assert_eq!(wait(p, &sr, &mut [0]), Err(NcclError(NCCL_INVALID_USAGE)));
    assert_eq!(wait(p, &rr, &mut [0]), Err(NcclError(NCCL_REMOTE_ERROR)));
    assert!(small.data.iter().all(|&b| b == 0xaa), "nothing written");
    small.dereg(p, &recv);

    let huge = 3usize << 30;
    let mut rbuf = RegBuf::new(p, &recv, vec![0u8; huge]);
    let n = 1 << 20;
    sbuf.data[..n].copy_from_slice(&pattern(9, n));
    let rp = rbuf.ptr();
    let rr = p
        .irecv_sized(&recv, &[rp], &[huge], &[2], &[rbuf.mr()], false)
        .unwrap()
        .unwrap();
    let sr = until_some(|| p.isend_sized(&send, sp, n, 2, sbuf.mr()).unwrap());
    wait(p, &sr, &mut [0]).unwrap();
    let mut sz = [0];
    wait(p, &rr, &mut sz).unwrap();
    assert_eq!(sz[0] as usize, n);
    assert!(
        rbuf.data[..n] == pattern(9, n),
        "bytes of the 1 MiB message"
    );
    assert!(
        rbuf.data[n..n + 4096].iter().all(|&b| b == 0),
        "no byte past it"
    );
    rbuf.dereg(p, &recv);
    sbuf.dereg(p, &send);
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
}

/// `NCCL_NET_OPTIONAL_RECV_COMPLETION` preset in `*request` (v9+; the loader clears it for v8
/// as NCCL's adapter does): the plugin answers with a real request that completes once the
/// data is there, with the right size, each message delivered once, in order.
fn optional_completion_receives_complete_normally(abi: Abi) {
    let p = plugin_for(abi);
    let (send, recv, _) = connect_pair(p);
    const N: usize = 16;
    const SZ: usize = 3000;
    let mut rb = RegBuf::new(p, &recv, vec![0; N * SZ]);
    let mut sb = RegBuf::new(
        p,
        &send,
        (0..N).flat_map(|i| pattern(100 + i as u64, SZ)).collect(),
    );
    let (rp, sp) = (rb.ptr(), sb.ptr());
    let recvs: Vec<_> = (0..N)
        .map(|i| {
            let r = p
                .irecv_sized(
                    &recv,
                    &[rp.wrapping_add(i * SZ)],
                    &[SZ],
                    &[0],
                    &[rb.mr()],
                    true,
                )
                .unwrap()
                .expect("16 receives may be outstanding");
            assert_ne!(r.as_ptr() as usize, NCCL_NET_OPTIONAL_RECV_COMPLETION);
            r
        })
        .collect();
    let sends: Vec<_> = (0..N)
        .map(|i| {
            until_some(|| {
                p.isend_sized(&send, sp.wrapping_add(i * SZ), SZ, 0, sb.mr())
                    .unwrap()
            })
        })
        .collect();
    for s in &sends {
        wait(p, s, &mut [0]).unwrap();
    }
    for (i, r) in recvs.iter().enumerate() {
        let mut sz = [-1];
        wait(p, r, &mut sz).unwrap();
        assert_eq!(sz[0] as usize, SZ, "message {i}");
    }
    assert!(rb.data == sb.data, "every message in its buffer, once");
    rb.dereg(p, &recv);
    sb.dereg(p, &send);
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
}

/// The comm's traffic class (v10: `connect`'s config; v11: the context's) reaches every rail
/// socket of the connection, the acceptor's included (it adopts the connector's through the
/// handshake): `IP_TOS` of the two streams of each side's queue pair. Once both comms are
/// closed no socket carries it. Data still flows. `HA_TEST_TC_SKIP` not needed: sock only.
fn traffic_class_reaches_the_sockets(abi: Abi) {
    if abi < Abi::V10 {
        println!("{abi} has no traffic class");
        return;
    }
    if on_verbs() {
        println!("SKIPPED on verbs: the traffic class goes into the QP's GRH, not a socket");
        return;
    }
    // A DSCP value per version (ECN bits clear: TCP manages those), used by no other test.
    let tc: u8 = match abi {
        Abi::V10 => 0x68,
        Abi::V11 => 0xb8,
        _ => 0x88,
    };
    let p = plugin_for(abi);
    assert_eq!(sockets_with_tos(tc), 0);
    let ctx = p.init_context(0x7c, i32::from(tc)).unwrap();
    let (send, recv) = pair_in(p, &ctx);
    // Both ends' queue pairs connect their outbound stream in the background.
    assert!(
        eventually(|| sockets_with_tos(tc) >= 4),
        "rail sockets with IP_TOS {tc:#x}: {}",
        sockets_with_tos(tc)
    );
    let mut sb = RegBuf::new(p, &send, pattern(3, 4096));
    let mut rb = RegBuf::new(p, &recv, vec![0; 4096]);
    let rr = p
        .irecv_sized(&recv, &[rb.ptr()], &[4096], &[0], &[rb.mr()], false)
        .unwrap()
        .unwrap();
    let sp = sb.ptr();
    let sr = until_some(|| p.isend_sized(&send, sp, 4096, 0, sb.mr()).unwrap());
    wait(p, &sr, &mut [0]).unwrap();
    wait(p, &rr, &mut [0]).unwrap();
    assert!(rb.data == sb.data);
    sb.dereg(p, &send);
    rb.dereg(p, &recv);
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
    assert!(
        eventually(|| sockets_with_tos(tc) == 0),
        "sockets left with IP_TOS {tc:#x}: {}",
        sockets_with_tos(tc)
    );
    p.finalize(ctx).unwrap();
}

/// Out-of-range traffic classes are ignored (default class), not fatal.
fn bad_traffic_class_is_ignored(abi: Abi) {
    if abi < Abi::V10 {
        return;
    }
    let p = plugin_for(abi);
    let ctx = p.init_context(0x7d, 4096).unwrap();
    let (send, recv) = pair_in(p, &ctx);
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
    p.finalize(ctx).unwrap();
}

per_abi!(
    properties_per_version,
    sizes_beyond_int_max_reach_the_transport,
    optional_completion_receives_complete_normally,
    traffic_class_reaches_the_sockets,
    bad_traffic_class_is_ignored,
);

/// v9's own entry points reject NULL and bad arguments.
#[test]
fn v9_entries_check_their_arguments() {
    if !runs(Abi::V9) {
        return;
    }
    let p = plugin_for(Abi::V9);
    let t = p.table_v9().unwrap();
    assert!(t.make_v_device.is_none(), "no virtual NICs");
    let (send, recv, _) = connect_pair(p);
    let mut rb = RegBuf::new(p, &recv, vec![0; 64]);
    let mut req: *mut c_void = ptr::null_mut();
    let mut data = [rb.ptr().cast::<c_void>()];
    let mut sizes = [64usize];
    let mut tags = [0 as c_int];
    let mut mrs = [rb.mr().as_ptr()];
    // SAFETY (all calls): NULL or forged arguments on purpose; valid ones are live locals or
    // live plugin objects; the plugin must reject without touching memory it was not given.
    unsafe {
        assert_eq!(rc(t.get_properties.unwrap()(0, ptr::null_mut())), INVAL);
        assert_eq!(
            rc(t.get_properties.unwrap()(-1, &mut std::mem::zeroed())),
            INVAL
        );
        assert_eq!(
            rc(t.isend.unwrap()(
                send.as_ptr(),
                data[0],
                8,
                0,
                mrs[0],
                ptr::null_mut()
            )),
            INVAL
        );
        assert_eq!(
            rc(t.irecv.unwrap()(
                recv.as_ptr(),
                1,
                data.as_mut_ptr(),
                ptr::null_mut(),
                tags.as_mut_ptr(),
                mrs.as_mut_ptr(),
                &mut req
            )),
            INVAL
        );
        assert!(req.is_null(), "a failed irecv leaves no request");
        req = NCCL_NET_OPTIONAL_RECV_COMPLETION as *mut c_void;
        assert_eq!(
            rc(t.irecv.unwrap()(
                recv.as_ptr(),
                0,
                data.as_mut_ptr(),
                sizes.as_mut_ptr(),
                tags.as_mut_ptr(),
                mrs.as_mut_ptr(),
                &mut req
            )),
            INVAL
        );
        assert!(req.is_null(), "the hint is never left in *request");
        assert_eq!(
            rc(t.irecv.unwrap()(
                send.as_ptr(),
                1,
                data.as_mut_ptr(),
                sizes.as_mut_ptr(),
                tags.as_mut_ptr(),
                mrs.as_mut_ptr(),
                ptr::null_mut()
            )),
            INVAL
        );
    }
    rb.dereg(p, &recv);
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
}

/// v10's `init` accepts a profiler callback, and `connect` a NULL config (default class).
#[test]
fn v10_init_takes_a_profiler_and_connect_a_null_config() {
    if !runs(Abi::V10) {
        return;
    }
    unsafe extern "C" fn profiler(
        _e: *mut *mut c_void,
        _kind: c_int,
        _p: *mut c_void,
        _id: i64,
        _ext: *mut c_void,
    ) -> c_int {
        NCCL_SUCCESS
    }
    let p = plugin_for(Abi::V10);
    let t = p.table_v10().unwrap();
    assert!(t.make_v_device.is_none());
    // SAFETY: NULL logger, a valid profiler callback (never called back: no events).
    assert_eq!(rc(unsafe { t.init.unwrap()(None, Some(profiler)) }), Ok(()));
    let (mut handle, listen) = p.listen(listen_dev()).unwrap();
    let mut send: *mut c_void = ptr::null_mut();
    let mut recv = None;
    let deadline = Instant::now() + Duration::from_secs(30);
    while send.is_null() || recv.is_none() {
        assert!(Instant::now() < deadline, "handshake did not finish");
        if send.is_null() {
            // SAFETY: NULL config on purpose; live handle buffer and out-pointer.
            let r = unsafe {
                t.connect.unwrap()(
                    connect_dev(),
                    ptr::null_mut(),
                    handle.as_mut_ptr().cast(),
                    &mut send,
                    ptr::null_mut(),
                )
            };
            assert_eq!(rc(r), Ok(()));
        }
        if recv.is_none() {
            recv = p.accept(&listen).unwrap();
        }
        std::thread::yield_now();
    }
    let mut config = NcclNetCommConfigV10 {
        traffic_class: NCCL_NET_TRAFFIC_CLASS_UNDEF,
    };
    // SAFETY: NULL out-pointer on purpose.
    let r = unsafe {
        t.connect.unwrap()(
            connect_dev(),
            &mut config,
            handle.as_mut_ptr().cast(),
            ptr::null_mut(),
            ptr::null_mut(),
        )
    };
    assert_eq!(rc(r), INVAL);
    // SAFETY: `send` is the live send comm just made.
    assert_eq!(rc(unsafe { t.close_send.unwrap()(send) }), Ok(()));
    p.close_recv(recv.unwrap()).unwrap();
    p.close_listen(listen).unwrap();
}

/// v11's context entry points: NULL and forged contexts are refused, `finalize(NULL)` (what
/// NCCL calls after a failed `init`) is a no-op, `setNetAttr` takes NCCL's hints, and a
/// finalized context is dead for every later call.
#[test]
fn v11_context_entries_check_their_arguments() {
    if !runs(Abi::V11) {
        return;
    }
    let p = plugin_for(Abi::V11);
    let t = p.table_v11().unwrap();
    assert!(t.make_v_device.is_none());
    let mut handle = [0u8; 128];
    let mut comm: *mut c_void = ptr::null_mut();
    let forged = 0x1234 as *mut c_void;
    // SAFETY (all calls): NULL or forged arguments on purpose; out-pointers are live locals.
    unsafe {
        assert_eq!(
            rc(t.init.unwrap()(
                ptr::null_mut(),
                1,
                ptr::null_mut(),
                None,
                None
            )),
            INVAL
        );
        assert_eq!(rc(t.finalize.unwrap()(ptr::null_mut())), Ok(()));
        assert_eq!(rc(t.finalize.unwrap()(forged)), INVAL);
        assert_eq!(
            rc(t.listen.unwrap()(
                forged,
                0,
                handle.as_mut_ptr().cast(),
                &mut comm
            )),
            INVAL
        );
        assert_eq!(
            rc(t.listen.unwrap()(
                ptr::null_mut(),
                0,
                handle.as_mut_ptr().cast(),
                &mut comm
            )),
            INVAL
        );
        assert_eq!(
            rc(t.connect.unwrap()(
                forged,
                0,
                handle.as_mut_ptr().cast(),
                &mut comm,
                ptr::null_mut()
            )),
            INVAL
        );
        assert_eq!(rc(t.get_properties.unwrap()(0, ptr::null_mut())), INVAL);
    }
    let ctx = p.init_context(0xabc, NCCL_NET_TRAFFIC_CLASS_UNDEF).unwrap();
    let attr = NetAttr::default();
    assert_eq!(p.set_net_attr(&ctx, &attr), Ok(true));
    // SAFETY: live context, NULL attribute pointer on purpose; then a forged context.
    unsafe {
        assert_eq!(
            rc(t.set_net_attr.unwrap()(ctx.as_ptr(), ptr::null_mut())),
            INVAL
        );
        let mut a = attr;
        assert_eq!(rc(t.set_net_attr.unwrap()(forged, &mut a)), INVAL);
    }
    let raw = ctx.as_ptr();
    p.finalize(ctx).unwrap();
    // SAFETY: a finalized context on purpose; out-pointers are live locals.
    unsafe {
        assert_eq!(
            rc(t.finalize.unwrap()(raw)),
            Err(NcclError(NCCL_INVALID_USAGE))
        );
        assert_eq!(
            rc(t.listen.unwrap()(
                raw,
                0,
                handle.as_mut_ptr().cast(),
                &mut comm
            )),
            Err(NcclError(NCCL_INVALID_USAGE))
        );
        let mut a = attr;
        assert_eq!(
            rc(t.set_net_attr.unwrap()(raw, &mut a)),
            Err(NcclError(NCCL_INVALID_USAGE))
        );
    }
}

/// v12's `getProperties` writes every field of the 128-byte struct over memory NCCL leaves
/// uninitialised (poisoned here): one physical device, the unused seven `devs` zero,
/// `maxMultiRequestSize` 1, `railId`/`planeId` -1; NULL is refused. Its `init` refuses a NULL
/// context pointer (the context entries are v11's, run by the per-version suites).
#[test]
fn v12_properties_fill_every_field() {
    use nccl_net_abi::v12::{NcclNetPropertiesV12, NCCL_NET_ID_UNDEF};
    if !runs(Abi::V12) {
        return;
    }
    let p = plugin_for(Abi::V12);
    let t = p.table_v12().unwrap();
    assert!(t.make_v_device.is_none());
    assert!(t.finalize.is_some() && t.set_net_attr.is_some());
    let mut raw = std::mem::MaybeUninit::<NcclNetPropertiesV12>::uninit();
    // SAFETY: poisoning the bytes of a local; the struct is only read after the plugin wrote
    // it (every field), and reading plain-data fields is valid for any bit pattern.
    let props = unsafe {
        std::ptr::write_bytes(raw.as_mut_ptr().cast::<u8>(), 0xa5, 128);
        assert_eq!(rc(t.get_properties.unwrap()(0, raw.as_mut_ptr())), Ok(()));
        raw.assume_init()
    };
    let d = p.properties(0).unwrap();
    assert_eq!(
        (props.rail_id, props.plane_id),
        (NCCL_NET_ID_UNDEF, NCCL_NET_ID_UNDEF)
    );
    assert_eq!(props.max_multi_request_size, 1);
    assert_eq!(props.v_props.ndevs, 1);
    assert_eq!(props.v_props.devs, [0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(props.max_p2p_bytes, 1 << 30);
    assert_eq!(props.max_coll_bytes, 512 << 20);
    assert_eq!(props.net_device_type, 0);
    assert_eq!(props.net_device_version, 0);
    assert_eq!(props.force_flush, 0);
    assert_eq!(props.reg_is_global, 0);
    assert_eq!(props.latency, 0.0);
    assert_eq!(props.max_recvs, expected_max_recvs());
    assert_eq!(props.max_comms, d.max_comms);
    assert_eq!(
        (props.guid, props.speed, props.port),
        (d.guid, d.speed, d.port)
    );
    assert!(!props.name.is_null());
    // SAFETY: NULL arguments on purpose.
    unsafe {
        assert_eq!(rc(t.get_properties.unwrap()(0, ptr::null_mut())), INVAL);
        assert_eq!(
            rc(t.init.unwrap()(
                ptr::null_mut(),
                1,
                ptr::null_mut(),
                None,
                None
            )),
            INVAL
        );
    }
    let mut raw = std::mem::MaybeUninit::<NcclNetPropertiesV12>::uninit();
    // SAFETY: a device that does not exist; the out-struct is a live local.
    let r = unsafe { t.get_properties.unwrap()(99, raw.as_mut_ptr()) };
    assert_eq!(rc(r), INVAL);
}
