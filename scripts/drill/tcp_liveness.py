#!/usr/bin/env python3
"""What the kernel's TCP says about a peer that stopped running versus a link that died.

Measures, on this kernel, the facts the `sock` fabric's liveness rule rests on (see
crates/ha-core/src/fabric/sock/mod.rs, "# Failures"):

  paused-busy   the receiving process is SIGSTOPped while the sender streams: does the kernel
                keep acknowledging (zero window, answered window probes)? does TCP_USER_TIMEOUT
                kill such a connection?
  paused-idle   the receiving process is SIGSTOPped with nothing in flight, keepalive on
  cut-busy      the link is cut (veth down at the far end) with data in flight
  cut-idle      the link is cut with nothing in flight, keepalive on
  cut-zerowin   the receiver is paused until the window is zero, then the link is cut

Each case prints TCP_INFO samples of the sender's socket (state, unacked, probes, backoff,
last_ack_recv ms, notsent bytes) and when/how the socket failed. Needs root and iproute2
(two network namespaces named tcpl<pid>a / tcpl<pid>b, removed at the end).

usage: tcp_liveness.py [CASE...]   (default: all cases)
"""
import ctypes
import os
import signal
import socket
import struct
import subprocess
import sys
import time

PID = os.getpid()
NS_A, NS_B = f"tcpl{PID}a", f"tcpl{PID}b"
A_IP, B_IP = "10.77.0.1", "10.77.0.2"
USER_TIMEOUT_MS = 1000
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd):
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns")


def ip(*args):
    subprocess.run(["ip", *args], check=True)


def up():
    ip("netns", "add", NS_A)
    ip("netns", "add", NS_B)
    ip("-n", NS_A, "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", NS_B)
    ip("-n", NS_A, "addr", "add", A_IP + "/24", "dev", "va")
    ip("-n", NS_B, "addr", "add", B_IP + "/24", "dev", "vb")
    for ns, d in ((NS_A, "va"), (NS_B, "vb")):
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", ns, "link", "set", d, "up")
    time.sleep(0.5)


def down():
    for ns in (NS_A, NS_B):
        subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)


def setns(name):
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    _setns(fd)
    os.close(fd)


TCPI = struct.Struct("=BBBBBBBB" + "I" * 24)


def tcp_info(s):
    raw = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    v = TCPI.unpack_from(raw)
    # u8 x8: state ca_state retransmits probes backoff options wscale flags
    # u32: rto ato snd_mss rcv_mss unacked sacked lost retrans fackets
    #      last_data_sent last_ack_sent last_data_recv last_ack_recv ...
    u = v[8:]
    notsent = struct.unpack_from("=I", raw, 8 + 4 * 24 + 8 * 4 + 4 * 2)[0] if len(raw) >= 152 else -1
    return {
        "state": v[0],
        "retransmits": v[2],
        "probes": v[3],
        "backoff": v[4],
        "rto_ms": u[0] // 1000,
        "unacked": u[4],
        "last_data_sent": u[9],
        "last_data_recv": u[11],
        "last_ack_recv": u[12],
        "notsent": notsent,
        "snd_wnd": struct.unpack_from("=I", raw, 228)[0] if len(raw) >= 232 else -1,
    }


def receiver(paused_evt_w, mode):
    """Child in NS_B: accept one connection, read (or not), report its pid."""
    setns(NS_B)
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 << 10)
    ls.bind((B_IP, 7777))
    ls.listen(1)
    os.write(paused_evt_w, b"L")
    c, _ = ls.accept()
    while True:
        b = c.recv(1 << 16)
        if not b:
            return


def run_case(case):
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(r)
        try:
            receiver(w, case)
        finally:
            os._exit(0)
    os.close(w)
    os.read(r, 1)
    setns(NS_A)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 256 << 10)
    user_timeout = not case.endswith("-nout")
    base = case[: -len("-nout")] if not user_timeout else case
    if user_timeout:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, USER_TIMEOUT_MS)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 1)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
    s.connect((B_IP, 7777))
    s.setblocking(False)
    busy = base in ("paused-busy", "cut-busy", "cut-zerowin")
    case = base
    t0 = time.monotonic()
    if case.startswith("paused"):
        events = [(0.5, "stop")]
    elif case == "cut-zerowin":
        events = [(0.5, "stop"), (2.0, "cut")]
    else:
        events = [(0.5, "cut")]
    end = t0 + (8.0 if case.startswith("paused") or case == "cut-zerowin" else 6.0)
    chunk = b"x" * 65536
    print(f"== {case}{'' if user_timeout else '-nout'} (TCP_USER_TIMEOUT {USER_TIMEOUT_MS} ms"
          f"{'' if user_timeout else ' NOT SET'}, keepalive idle 1 s intvl 1 s cnt 3)")
    last_print = 0.0
    failed = None
    while time.monotonic() < end:
        now = time.monotonic() - t0
        while events and now >= events[0][0]:
            what = events.pop(0)[1]
            if what == "stop":
                os.kill(child, signal.SIGSTOP)
                print(f"  t={now:5.2f}s receiver SIGSTOPped")
            else:
                ip("-n", NS_B, "link", "set", "vb", "down")
                print(f"  t={now:5.2f}s far end of the link set down")
        if busy:
            try:
                s.send(chunk)
            except BlockingIOError:
                pass
            except OSError as e:
                failed = (now, e)
                break
        else:
            try:
                if s.recv(1) == b"":
                    failed = (now, "EOF")
                    break
            except BlockingIOError:
                pass
            except OSError as e:
                failed = (now, e)
                break
        err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            failed = (now, os.strerror(err))
            break
        if now - last_print >= 0.25:
            last_print = now
            i = tcp_info(s)
            print(f"  t={now:5.2f}s state {i['state']} unacked {i['unacked']:3} probes {i['probes']} "
                  f"backoff {i['backoff']} rto {i['rto_ms']} ms last_ack_recv {i['last_ack_recv']:5} ms "
                  f"last_data_recv {i['last_data_recv']:5} ms notsent {i['notsent']} snd_wnd {i['snd_wnd']}")
        time.sleep(0.005)
    if failed:
        print(f"  t={failed[0]:5.2f}s socket FAILED: {failed[1]}")
    else:
        print(f"  socket alive after {end - t0:.1f} s")
    try:
        os.kill(child, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(child, 0)
    s.close()
    # back to the root namespace for the next case
    setns_root()


ROOT_NS = None


def setns_root():
    _setns(ROOT_NS)


def main():
    global ROOT_NS
    if os.geteuid() != 0:
        sys.exit("tcp_liveness: needs root")
    ROOT_NS = os.open("/proc/self/ns/net", os.O_RDONLY)
    cases = sys.argv[1:] or ["paused-busy", "paused-busy-nout", "paused-idle", "cut-busy",
                             "cut-busy-nout", "cut-idle", "cut-idle-nout", "cut-zerowin",
                             "cut-zerowin-nout"]
    print(f"kernel {os.uname().release}")
    for c in cases:
        down()
        up()
        try:
            run_case(c)
        finally:
            setns_root()
            down()


if __name__ == "__main__":
    main()
