#!/usr/bin/python3
"""End-to-end: the fault-injection script (tests/faults/faults.py) in small:
10 runs of each case (TP2-KILL, TP4-KILL, TP2-STOP, TP4-STOP), each a
`tensorpar generate --tp N` job with one rank SIGKILLed or SIGSTOPped at a
random moment.  Every run must end within 5 s of the signal, non-zero, with
a message naming the rank, and leave no process or /dev/shm segment.

Short runs (the tiny preset, 48 new tokens: about 0.3 s, 1.3 s under
ASan) and TENSORPAR_HANG_TIMEOUT=1 keep it within a minute; scripts/faults.sh
runs the full 100 on the small preset with the defaults.

    TENSORPAR_BIN=build/tensorpar /usr/bin/python3 tests/e2e/test_faults.py
"""
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "faults", "faults.py")


def main():
    t0 = time.time()
    cmd = ["/usr/bin/python3", SCRIPT, "--bin", os.environ["TENSORPAR_BIN"], "--runs",
           os.environ.get("TENSORPAR_FAULT_RUNS", "10"), "--preset", "tiny", "--tokens", "48", "--hang-timeout", "1"]
    p = subprocess.run(cmd, timeout=600)
    print(f"test_faults: {time.time() - t0:.1f} s")
    return p.returncode


if __name__ == "__main__":
    sys.exit(main())
