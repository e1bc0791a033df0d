"""The repository stands alone: a clone in a fresh temporary folder, with no
sibling "shared" folder beside it, runs the README's main job (scripts/demo.sh) to the end.

It clones the committed HEAD of this checkout (what CI and a user get), so a
dirty working tree is tested only once committed."""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tpe2e import ROOT, job_env  # noqa: E402


def main():
    if not os.path.exists(os.path.join(ROOT, ".git")):  # a file in a worktree
        print("FAIL: the source tree is not a git checkout; cannot clone it", file=sys.stderr)
        return 1
    if os.environ.get("TENSORPAR_SANITIZED") == "1":
        # The demo builds its own plain Release binary in the clone, so this
        # run would repeat the plain suite's run exactly (minutes of CI).
        print("skipped: the sanitizer build's suite; the plain build's suite runs the demo in a clone")
        return 0
    top = tempfile.mkdtemp(prefix="tp-clone-")
    try:
        clone = os.path.join(top, "elsewhere")
        subprocess.run(["git", "clone", "-q", ROOT, clone], check=True)
        assert not os.path.exists(os.path.join(top, "shared"))
        env = job_env()
        # A plain build: the sanitizer options of the suite do not apply here.
        for k in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS", "CC"):
            env.pop(k, None)
        env["TP_DEMO_MODEL"] = os.path.join(top, "model")
        p = subprocess.run(["bash", "scripts/demo.sh"], cwd=clone, env=env,
                           capture_output=True, text=True, timeout=800)
        out = p.stdout + p.stderr
        if p.returncode != 0 or "same tokens" not in p.stdout:
            print(out[-6000:], file=sys.stderr)
            print(f"FAIL: scripts/demo.sh in a fresh clone exited {p.returncode}", file=sys.stderr)
            return 1
        print(out[-1500:])
        print("1 passed, 0 failed")
        return 0
    finally:
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
