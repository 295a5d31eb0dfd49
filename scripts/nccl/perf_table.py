"""Join two nccl-tests logs (HA first, reference second) into one markdown table."""
import re
import sys


def rows(path):
    out = {}
    wrong_total = 0
    for line in open(path, errors="replace"):
        f = line.split()
        # size count type redop root | out-of-place: time algbw busbw #wrong | in-place: ...
        if len(f) >= 13 and f[0].isdigit() and f[2] in ("float", "half", "bfloat16", "double", "int32", "int8", "uint8"):
            size = int(f[0])
            oop_time, oop_bus, oop_wrong = f[5], f[7], f[8]
            ip_time, ip_bus, ip_wrong = f[9], f[11], f[12]
            wrong = [w for w in (oop_wrong, ip_wrong) if w not in ("N/A",)]
            wrong_total += sum(int(w) for w in wrong if w.isdigit())
            out[size] = (float(oop_time), float(oop_bus), float(ip_bus), "/".join(wrong) or "N/A")
    avg = re.findall(r"Avg bus bandwidth\s*:\s*([\d.]+)", open(path, errors="replace").read())
    return out, wrong_total, avg


def human(n):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


ha, ha_wrong, ha_avg = rows(sys.argv[1])
ref, ref_wrong, ref_avg = rows(sys.argv[2])
print("| size | HA time (us) | HA busbw (GB/s) | Socket time (us) | Socket busbw (GB/s) | speed HA/Socket | HA #wrong |")
print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for size in sorted(ha):
    t, b, _, w = ha[size]
    rt, rb, _, _ = ref.get(size, (float("nan"),) * 3 + ("",))
    ratio = rt / t if t else float("nan")  # time ratio: > 1 means HA is faster
    print(f"| {human(size)} | {t:.1f} | {b:.2f} | {rt:.1f} | {rb:.2f} | {ratio:.2f} | {w} |")
print(f"\nHA: #wrong total {ha_wrong}, avg busbw {ha_avg}; Socket: #wrong total {ref_wrong}, avg busbw {ref_avg}")
