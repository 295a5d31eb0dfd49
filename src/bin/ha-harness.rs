//! `ha-harness <check|bench> --plugin PATH ...`: functional checks and benchmarks for any
//! NCCL ext-net v8 plugin (see `nccl_net_ha::harness`).

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(nccl_net_ha::harness::main_with_args(&args));
}
