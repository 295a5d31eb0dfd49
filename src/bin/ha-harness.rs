//! `ha-harness <check|bench> --plugin PATH ...`: functional checks and benchmarks for any
//! NCCL ext-net v8 plugin (see `nccl_net_ha::harness`); `ha-harness stream ...` streams
//! verified traffic for failover drills (see `nccl_net_ha::harness::stream`).

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(match args.first().map(String::as_str) {
        Some("stream" | "now") => nccl_net_ha::harness::stream::main_with_args(&args),
        _ => nccl_net_ha::harness::main_with_args(&args),
    });
}
