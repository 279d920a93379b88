"""A Python job that never imports torch (probe tests): it computes something, writes the
result to argv[1], and waits for argv[2] to exist (at most 60 s) before exiting."""

import os
import sys
import time


def main() -> int:
    out, hold = sys.argv[1], sys.argv[2]
    total = sum(i * i for i in range(200_000))
    with open(out, "w") as f:
        f.write(f"{total}\n")
    deadline = time.monotonic() + 60
    while not os.path.exists(hold) and time.monotonic() < deadline:
        time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
