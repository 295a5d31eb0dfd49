//! `ha-harness <check|bench> --plugin PATH ...`: functional checks and benchmarks for any
//! NCCL ext-net v8 plugin (see `ha_harness`); `ha-harness stream ...` streams
//! verified traffic for failover drills (see `ha_harness::stream`); `ha-harness stats FILE`
//! reads a plugin's stats file and `ha-harness timeline` draws it (`ha_harness::stats`,
//! `ha_harness::picture`); `ha-harness drain|undrain|drained` edit the node's drain list
//! (see `ha_harness::drain`); `ha-harness limit` puts the plugin's small-message round trip
//! next to a raw TCP ping-pong on the same address (see `ha_harness::limit`); `ha-harness calls`
//! times the plugin's idle calls (see `ha_harness::calls`).

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(match args.first().map(String::as_str) {
        Some("stream" | "now") => ha_harness::stream::main_with_args(&args),
        Some("stats") => ha_harness::stats::main_with_args(&args[1..]),
        Some("timeline") => ha_harness::picture::main_with_args(&args[1..]),
        Some("drain" | "undrain" | "drained") => ha_harness::drain::main_with_args(&args),
        Some("limit") => ha_harness::limit::main_with_args(&args[1..]),
        Some("limit-tcp-ping") => ha_harness::limit::tcp_ping_main(&args[1..]),
        Some("limit-tcp-echo") => ha_harness::limit::tcp_echo_main(&args[1..]),
        Some("svg2png") => ha_harness::picture::svg2png_main(&args[1..]),
        Some("scale") => ha_harness::scale::main_with_args(&args[1..]),
        Some("calls") => ha_harness::calls::main_with_args(&args[1..]),
        Some("scale-peer") => ha_harness::scale::peer_main(&args[1..]),
        _ => ha_harness::main_with_args(&args),
    });
}
