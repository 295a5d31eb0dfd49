//! Checks that include/nccl_net_ha.h and the Rust mirrors in `nccl_net_abi::v{8,...,12}`
//! agree on the size, alignment and every field offset of every structure of every exported
//! ABI version, by compiling a small C program against the header with `cc` and comparing
//! what it prints. Also checks that the header compiles as C++ when `g++` is available.

use nccl_net_abi::v10::{
    NcclNetCommConfigV10, NcclNetDeviceHandleV10, NcclNetPropertiesV10, NcclNetV10,
    NcclNetVDevicePropsV10,
};
use nccl_net_abi::v11::{
    NcclNetAttrV11, NcclNetCommAttrV11, NcclNetCommConfigV11, NcclNetDeviceHandleV11,
    NcclNetPropertiesV11, NcclNetV11, NcclNetVDevicePropsV11,
};
use nccl_net_abi::v12::{
    NcclNetAttrV12, NcclNetCommAttrV12, NcclNetCommConfigV12, NcclNetDeviceHandleV12,
    NcclNetPropertiesV12, NcclNetV12, NcclNetVDevicePropsV12,
};
use nccl_net_abi::v8::{NcclNetDeviceHandleV8, NcclNetPropertiesV8, NcclNetV8};
use nccl_net_abi::v9::{
    NcclNetDeviceHandleV9, NcclNetPropertiesV9, NcclNetV9, NcclNetVDevicePropsV9,
};
use std::collections::BTreeMap;
use std::mem::{align_of, offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;

/// One C struct: its C name, Rust size/align, and (C field, Rust offset) pairs in order.
struct StructLayout {
    c_name: &'static str,
    size: usize,
    align: usize,
    fields: Vec<(&'static str, usize)>,
}

/// `layout!(RustType, "c_name", "cField" => rust_field, ...)`.
macro_rules! layout {
    ($t:ty, $c:literal, $($cf:literal => $rf:ident),* $(,)?) => {
        StructLayout {
            c_name: $c,
            size: size_of::<$t>(),
            align: align_of::<$t>(),
            fields: vec![$(($cf, offset_of!($t, $rf))),*],
        }
    };
}

/// The properties of v9 and later (`$extra`: fields after `maxCollBytes`).
macro_rules! props_v9_layout {
    ($t:ty, $c:literal $(, $cf:literal => $rf:ident)*) => {
        layout!($t, $c,
            "name" => name, "pciPath" => pci_path, "guid" => guid, "ptrSupport" => ptr_support,
            "regIsGlobal" => reg_is_global, "forceFlush" => force_flush, "speed" => speed,
            "port" => port, "latency" => latency, "maxComms" => max_comms,
            "maxRecvs" => max_recvs, "netDeviceType" => net_device_type,
            "netDeviceVersion" => net_device_version, "vProps" => v_props,
            "maxP2pBytes" => max_p2p_bytes, "maxCollBytes" => max_coll_bytes
            $(, $cf => $rf)*)
    };
}

/// The entry points every version from v8 on has at the same names (`$extra` after them).
macro_rules! net_layout {
    ($t:ty, $c:literal $(, $cf:literal => $rf:ident)*) => {
        layout!($t, $c,
            "name" => name, "init" => init, "devices" => devices,
            "getProperties" => get_properties, "listen" => listen, "connect" => connect,
            "accept" => accept, "regMr" => reg_mr, "regMrDmaBuf" => reg_mr_dma_buf,
            "deregMr" => dereg_mr, "isend" => isend, "irecv" => irecv, "iflush" => iflush,
            "test" => test, "closeSend" => close_send, "closeRecv" => close_recv,
            "closeListen" => close_listen, "getDeviceMr" => get_device_mr,
            "irecvConsumed" => irecv_consumed
            $(, $cf => $rf)*)
    };
}

macro_rules! dev_handle_layout {
    ($t:ty, $c:literal) => {
        layout!($t, $c,
            "netDeviceType" => net_device_type, "netDeviceVersion" => net_device_version,
            "handle" => handle, "size" => size, "needsProxyProgress" => needs_proxy_progress)
    };
}

/// v9, v10, v11 and v12 structures.
fn newer_layouts() -> Vec<StructLayout> {
    vec![
        dev_handle_layout!(NcclNetDeviceHandleV9, "ncclNetDeviceHandle_v9_t"),
        layout!(NcclNetVDevicePropsV9, "ncclNetVDeviceProps_v9_t", "ndevs" => ndevs, "devs" => devs),
        props_v9_layout!(NcclNetPropertiesV9, "ncclNetProperties_v9_t"),
        net_layout!(NcclNetV9, "ncclNet_v9_t", "makeVDevice" => make_v_device),
        dev_handle_layout!(NcclNetDeviceHandleV10, "ncclNetDeviceHandle_v10_t"),
        layout!(NcclNetVDevicePropsV10, "ncclNetVDeviceProps_v10_t", "ndevs" => ndevs, "devs" => devs),
        props_v9_layout!(NcclNetPropertiesV10, "ncclNetProperties_v10_t"),
        layout!(NcclNetCommConfigV10, "ncclNetCommConfig_v10_t", "trafficClass" => traffic_class),
        net_layout!(NcclNetV10, "ncclNet_v10_t", "makeVDevice" => make_v_device),
        dev_handle_layout!(NcclNetDeviceHandleV11, "ncclNetDeviceHandle_v11_t"),
        layout!(NcclNetVDevicePropsV11, "ncclNetVDeviceProps_v11_t", "ndevs" => ndevs, "devs" => devs),
        props_v9_layout!(NcclNetPropertiesV11, "ncclNetProperties_v11_t",
            "maxMultiRequestSize" => max_multi_request_size),
        layout!(NcclNetCommConfigV11, "ncclNetCommConfig_v11_t", "trafficClass" => traffic_class),
        layout!(NcclNetCommAttrV11, "ncclNetCommAttr_v11_t",
            "maxConcurrentPeers" => max_concurrent_peers,
            "minConcurrentPeers" => min_concurrent_peers,
            "maxFlowsPerPeer" => max_flows_per_peer,
            "minFlowsPerPeer" => min_flows_per_peer),
        layout!(NcclNetAttrV11, "ncclNetAttr_v11_t",
            "sendCommAttr" => send_comm_attr, "recvCommAttr" => recv_comm_attr,
            "op" => op, "algo" => algo, "proto" => proto),
        net_layout!(NcclNetV11, "ncclNet_v11_t",
            "makeVDevice" => make_v_device, "finalize" => finalize, "setNetAttr" => set_net_attr),
        dev_handle_layout!(NcclNetDeviceHandleV12, "ncclNetDeviceHandle_v12_t"),
        layout!(NcclNetVDevicePropsV12, "ncclNetVDeviceProps_v12_t", "ndevs" => ndevs, "devs" => devs),
        props_v9_layout!(NcclNetPropertiesV12, "ncclNetProperties_v12_t",
            "maxMultiRequestSize" => max_multi_request_size, "railId" => rail_id,
            "planeId" => plane_id),
        layout!(NcclNetCommConfigV12, "ncclNetCommConfig_v12_t", "trafficClass" => traffic_class),
        layout!(NcclNetCommAttrV12, "ncclNetCommAttr_v12_t",
            "maxConcurrentPeers" => max_concurrent_peers,
            "minConcurrentPeers" => min_concurrent_peers,
            "maxFlowsPerPeer" => max_flows_per_peer,
            "minFlowsPerPeer" => min_flows_per_peer),
        layout!(NcclNetAttrV12, "ncclNetAttr_v12_t",
            "sendCommAttr" => send_comm_attr, "recvCommAttr" => recv_comm_attr,
            "op" => op, "algo" => algo, "proto" => proto),
        net_layout!(NcclNetV12, "ncclNet_v12_t",
            "makeVDevice" => make_v_device, "finalize" => finalize, "setNetAttr" => set_net_attr),
    ]
}

fn expected_layouts() -> Vec<StructLayout> {
    let mut all = v8_layouts();
    all.extend(newer_layouts());
    all
}

fn v8_layouts() -> Vec<StructLayout> {
    vec![
        StructLayout {
            c_name: "ncclNetProperties_v8_t",
            size: size_of::<NcclNetPropertiesV8>(),
            align: align_of::<NcclNetPropertiesV8>(),
            fields: vec![
                ("name", offset_of!(NcclNetPropertiesV8, name)),
                ("pciPath", offset_of!(NcclNetPropertiesV8, pci_path)),
                ("guid", offset_of!(NcclNetPropertiesV8, guid)),
                ("ptrSupport", offset_of!(NcclNetPropertiesV8, ptr_support)),
                (
                    "regIsGlobal",
                    offset_of!(NcclNetPropertiesV8, reg_is_global),
                ),
                ("speed", offset_of!(NcclNetPropertiesV8, speed)),
                ("port", offset_of!(NcclNetPropertiesV8, port)),
                ("latency", offset_of!(NcclNetPropertiesV8, latency)),
                ("maxComms", offset_of!(NcclNetPropertiesV8, max_comms)),
                ("maxRecvs", offset_of!(NcclNetPropertiesV8, max_recvs)),
                (
                    "netDeviceType",
                    offset_of!(NcclNetPropertiesV8, net_device_type),
                ),
                (
                    "netDeviceVersion",
                    offset_of!(NcclNetPropertiesV8, net_device_version),
                ),
            ],
        },
        StructLayout {
            c_name: "ncclNetDeviceHandle_v8_t",
            size: size_of::<NcclNetDeviceHandleV8>(),
            align: align_of::<NcclNetDeviceHandleV8>(),
            fields: vec![
                (
                    "netDeviceType",
                    offset_of!(NcclNetDeviceHandleV8, net_device_type),
                ),
                (
                    "netDeviceVersion",
                    offset_of!(NcclNetDeviceHandleV8, net_device_version),
                ),
                ("handle", offset_of!(NcclNetDeviceHandleV8, handle)),
                ("size", offset_of!(NcclNetDeviceHandleV8, size)),
                (
                    "needsProxyProgress",
                    offset_of!(NcclNetDeviceHandleV8, needs_proxy_progress),
                ),
            ],
        },
        StructLayout {
            c_name: "ncclNet_v8_t",
            size: size_of::<NcclNetV8>(),
            align: align_of::<NcclNetV8>(),
            fields: vec![
                ("name", offset_of!(NcclNetV8, name)),
                ("init", offset_of!(NcclNetV8, init)),
                ("devices", offset_of!(NcclNetV8, devices)),
                ("getProperties", offset_of!(NcclNetV8, get_properties)),
                ("listen", offset_of!(NcclNetV8, listen)),
                ("connect", offset_of!(NcclNetV8, connect)),
                ("accept", offset_of!(NcclNetV8, accept)),
                ("regMr", offset_of!(NcclNetV8, reg_mr)),
                ("regMrDmaBuf", offset_of!(NcclNetV8, reg_mr_dma_buf)),
                ("deregMr", offset_of!(NcclNetV8, dereg_mr)),
                ("isend", offset_of!(NcclNetV8, isend)),
                ("irecv", offset_of!(NcclNetV8, irecv)),
                ("iflush", offset_of!(NcclNetV8, iflush)),
                ("test", offset_of!(NcclNetV8, test)),
                ("closeSend", offset_of!(NcclNetV8, close_send)),
                ("closeRecv", offset_of!(NcclNetV8, close_recv)),
                ("closeListen", offset_of!(NcclNetV8, close_listen)),
                ("getDeviceMr", offset_of!(NcclNetV8, get_device_mr)),
                ("irecvConsumed", offset_of!(NcclNetV8, irecv_consumed)),
            ],
        },
    ]
}

fn include_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../include")
}

/// A fresh scratch directory under the system temp dir, removed on drop.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new(tag: &str) -> ScratchDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir =
            std::env::temp_dir().join(format!("nccl-net-ha-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        ScratchDir(dir)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// C source printing `STRUCT size N`, `STRUCT align N` and `STRUCT.FIELD N` lines.
fn c_program(layouts: &[StructLayout]) -> String {
    let mut src = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"nccl_net_ha.h\"\n\
         int main(void) {\n",
    );
    for l in layouts {
        let s = l.c_name;
        src.push_str(&format!(
            "  printf(\"{s} size %zu\\n\", sizeof({s}));\n  printf(\"{s} align %zu\\n\", _Alignof({s}));\n"
        ));
        for (f, _) in &l.fields {
            src.push_str(&format!(
                "  printf(\"{s}.{f} %zu\\n\", offsetof({s}, {f}));\n"
            ));
        }
    }
    // Use the exported declaration so a typo in it is caught too (address only, not linked).
    src.push_str(
        "  (void)sizeof(&ncclNetPlugin_v8);\n  (void)sizeof(&ncclNetPlugin_v9);\n\
         (void)sizeof(&ncclNetPlugin_v10);\n  (void)sizeof(&ncclNetPlugin_v11);\n\
         (void)sizeof(&ncclNetPlugin_v12);\n\
         return 0;\n}\n",
    );
    src
}

fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: could not run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

#[test]
fn header_layout_matches_rust_types() {
    let layouts = expected_layouts();
    let dir = ScratchDir::new("c-layout");
    let src = dir.0.join("layout.c");
    let exe = dir.0.join("layout");
    std::fs::write(&src, c_program(&layouts)).expect("write C source");
    run(
        Command::new("cc")
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
            .arg(include_dir())
            .arg("-o")
            .arg(&exe)
            .arg(&src),
        "compiling the layout probe with cc",
    );
    let printed = run(&mut Command::new(&exe), "running the layout probe");
    let c: BTreeMap<String, usize> = printed
        .lines()
        .map(|line| {
            let (k, v) = line.rsplit_once(' ').expect("`key value` line");
            (k.to_string(), v.parse().expect("number"))
        })
        .collect();

    let mut mismatches = Vec::new();
    let mut check = |key: String, rust: usize| match c.get(&key) {
        Some(&cv) if cv == rust => {}
        Some(&cv) => mismatches.push(format!("{key}: C says {cv}, Rust says {rust}")),
        None => mismatches.push(format!("{key}: not printed by the C probe")),
    };
    let mut checked = 0;
    for l in &layouts {
        check(format!("{} size", l.c_name), l.size);
        check(format!("{} align", l.c_name), l.align);
        checked += 2;
        for (f, off) in &l.fields {
            check(format!("{}.{f}", l.c_name), *off);
            checked += 1;
        }
    }
    assert!(
        mismatches.is_empty(),
        "include/nccl_net_ha.h and crates/nccl-net-abi/src/v*.rs disagree:\n  {}",
        mismatches.join("\n  ")
    );
    assert_eq!(checked, c.len(), "every printed value was compared");
    // The documented ABI sizes, so both sides drifting together is caught as well.
    assert_eq!(c["ncclNetProperties_v8_t size"], 64);
    assert_eq!(c["ncclNetDeviceHandle_v8_t size"], 32);
    assert_eq!(c["ncclNet_v8_t size"], 152);
    assert_eq!(c["ncclNetProperties_v9_t size"], 104);
    assert_eq!(c["ncclNetProperties_v9_t.vProps"], 64);
    assert_eq!(c["ncclNet_v9_t size"], 160);
    assert_eq!(c["ncclNet_v10_t size"], 160);
    assert_eq!(c["ncclNetProperties_v11_t size"], 112);
    assert_eq!(c["ncclNetAttr_v11_t size"], 44);
    assert_eq!(c["ncclNet_v11_t size"], 176);
    // v12: measured against NCCL 2.30.7's net_v12.h.
    assert_eq!(c["ncclNetProperties_v12_t size"], 128);
    assert_eq!(c["ncclNetProperties_v12_t.maxP2pBytes"], 104);
    assert_eq!(c["ncclNetProperties_v12_t.maxMultiRequestSize"], 120);
    assert_eq!(c["ncclNetProperties_v12_t.railId"], 124);
    assert_eq!(c["ncclNetProperties_v12_t.planeId"], 126);
    assert_eq!(c["ncclNetVDeviceProps_v12_t size"], 36);
    assert_eq!(c["ncclNetAttr_v12_t size"], 44);
    assert_eq!(c["ncclNet_v12_t size"], 176);
    // Every member of every table was compared (a table is a name plus entry points).
    for (t, entries) in [
        ("ncclNet_v8_t", 18),
        ("ncclNet_v9_t", 19),
        ("ncclNet_v10_t", 19),
        ("ncclNet_v11_t", 21),
        ("ncclNet_v12_t", 21),
    ] {
        let members = c.keys().filter(|k| k.starts_with(&format!("{t}."))).count();
        assert_eq!(members, entries + 1, "{t}");
        assert_eq!(c[&format!("{t} size")], 8 * (entries + 1), "{t}");
    }
}

#[test]
fn header_constants_match_rust() {
    use nccl_net_abi::common as k;
    let dir = ScratchDir::new("c-consts");
    let src = dir.0.join("consts.c");
    let exe = dir.0.join("consts");
    let consts: Vec<(&str, i64)> = vec![
        ("ncclSuccess", k::NCCL_SUCCESS.into()),
        (
            "ncclUnhandledCudaError",
            k::NCCL_UNHANDLED_CUDA_ERROR.into(),
        ),
        ("ncclSystemError", k::NCCL_SYSTEM_ERROR.into()),
        ("ncclInternalError", k::NCCL_INTERNAL_ERROR.into()),
        ("ncclInvalidArgument", k::NCCL_INVALID_ARGUMENT.into()),
        ("ncclInvalidUsage", k::NCCL_INVALID_USAGE.into()),
        ("ncclRemoteError", k::NCCL_REMOTE_ERROR.into()),
        ("NCCL_LOG_NONE", k::NCCL_LOG_NONE.into()),
        ("NCCL_LOG_VERSION", k::NCCL_LOG_VERSION.into()),
        ("NCCL_LOG_WARN", k::NCCL_LOG_WARN.into()),
        ("NCCL_LOG_INFO", k::NCCL_LOG_INFO.into()),
        ("NCCL_LOG_ABORT", k::NCCL_LOG_ABORT.into()),
        ("NCCL_LOG_TRACE", k::NCCL_LOG_TRACE.into()),
        ("NCCL_INIT", k::NCCL_INIT as i64),
        ("NCCL_NET", k::NCCL_NET as i64),
        ("NCCL_NET_HANDLE_MAXSIZE", k::NCCL_NET_HANDLE_MAXSIZE as i64),
        ("NCCL_PTR_HOST", k::NCCL_PTR_HOST.into()),
        ("NCCL_PTR_CUDA", k::NCCL_PTR_CUDA.into()),
        ("NCCL_PTR_DMABUF", k::NCCL_PTR_DMABUF.into()),
        ("NCCL_NET_MAX_REQUESTS", k::NCCL_NET_MAX_REQUESTS as i64),
        (
            "NCCL_NET_OPTIONAL_RECV_COMPLETION",
            k::NCCL_NET_OPTIONAL_RECV_COMPLETION as i64,
        ),
        ("NCCL_NET_DEVICE_HOST", k::NCCL_NET_DEVICE_HOST.into()),
        (
            "NCCL_NET_MAX_DEVS_PER_NIC",
            k::NCCL_NET_MAX_DEVS_PER_NIC as i64,
        ),
        (
            "NCCL_NET_TRAFFIC_CLASS_UNDEF",
            k::NCCL_NET_TRAFFIC_CLASS_UNDEF.into(),
        ),
        ("NCCL_NET_ATTR_UNDEF", k::NCCL_NET_ATTR_UNDEF.into()),
        (
            "NCCL_NET_MAX_DEVS_PER_NIC_V12",
            nccl_net_abi::v12::NCCL_NET_MAX_DEVS_PER_NIC_V12 as i64,
        ),
        (
            "NCCL_NET_ID_UNDEF",
            nccl_net_abi::v12::NCCL_NET_ID_UNDEF.into(),
        ),
        ("sizeof(ncclResult_t)", 4),
        ("sizeof(ncclNetDeviceType)", 4),
    ];
    let mut prog =
        String::from("#include <stdio.h>\n#include \"nccl_net_ha.h\"\nint main(void) {\n");
    for (name, _) in &consts {
        prog.push_str(&format!("  printf(\"%lld\\n\", (long long)({name}));\n"));
    }
    prog.push_str("  return 0;\n}\n");
    std::fs::write(&src, prog).expect("write C source");
    run(
        Command::new("cc")
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
            .arg(include_dir())
            .arg("-o")
            .arg(&exe)
            .arg(&src),
        "compiling the constants probe with cc",
    );
    let printed = run(&mut Command::new(&exe), "running the constants probe");
    let values: Vec<i64> = printed.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(values.len(), consts.len());
    let mismatches: Vec<String> = consts
        .iter()
        .zip(&values)
        .filter(|((_, rust), c)| rust != *c)
        .map(|((name, rust), c)| format!("{name}: C says {c}, Rust says {rust}"))
        .collect();
    assert!(
        mismatches.is_empty(),
        "include/nccl_net_ha.h and crates/nccl-net-abi/src/common.rs disagree:\n  {}",
        mismatches.join("\n  ")
    );
}

#[test]
fn header_is_valid_cpp() {
    let gxx_present = Command::new("g++").arg("--version").output().is_ok();
    if !gxx_present {
        eprintln!("SKIPPED header_is_valid_cpp: g++ not found on PATH");
        return;
    }
    let dir = ScratchDir::new("cpp-check");
    let src = dir.0.join("check.cpp");
    // Also assert the layout from C++ and that the declarations really have C linkage-compatible
    // names (the extern "C" block): taking the address of the exported table must compile.
    std::fs::write(
        &src,
        "#include \"nccl_net_ha.h\"\n\
         #include \"nccl_net_ha.h\" // include guard\n\
         static_assert(sizeof(ncclNetProperties_v8_t) == 64, \"props\");\n\
         static_assert(sizeof(ncclNetDeviceHandle_v8_t) == 32, \"devhandle\");\n\
         static_assert(sizeof(ncclNet_v8_t) == 152, \"net\");\n\
         static_assert(sizeof(ncclNet_v9_t) == 160, \"net9\");\n\
         static_assert(sizeof(ncclNet_v10_t) == 160, \"net10\");\n\
         static_assert(sizeof(ncclNet_v11_t) == 176, \"net11\");\n\
         static_assert(sizeof(ncclNetProperties_v11_t) == 112, \"props11\");\n\
         static_assert(sizeof(ncclNet_v12_t) == 176, \"net12\");\n\
         static_assert(sizeof(ncclNetProperties_v12_t) == 128, \"props12\");\n\
         const ncclNet_v8_t* table() { return &ncclNetPlugin_v8; }\n\
         const ncclNet_v9_t* table9() { return &ncclNetPlugin_v9; }\n\
         const ncclNet_v10_t* table10() { return &ncclNetPlugin_v10; }\n\
         const ncclNet_v11_t* table11() { return &ncclNetPlugin_v11; }\n\
         const ncclNet_v12_t* table12() { return &ncclNetPlugin_v12; }\n",
    )
    .expect("write C++ source");
    run(
        Command::new("g++")
            .args([
                "-std=c++11",
                "-fsyntax-only",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-I",
            ])
            .arg(include_dir())
            .arg(&src),
        "compiling the header as C++ with g++",
    );
}
