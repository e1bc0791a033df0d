"""`cmake --install` gives a library a C program can use: the build is
installed into a temporary prefix, examples/from_pretrained.c is built
against it twice — with `pkg-config --cflags --libs tensorpar` and with a
tiny CMake project using find_package(tensorpar) — and both programs, run
as 2 ranks by the installed `tensorpar launch`, generate the tokens that
`tensorpar generate --tp 2` (and TP = 1) generates."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tpe2e  # noqa: E402

BUILD = os.path.dirname(os.path.abspath(tpe2e.BIN))
EXAMPLE = os.path.join(tpe2e.ROOT, "examples", "from_pretrained.c")
SANITIZED = os.environ.get("TENSORPAR_SANITIZED", "0") == "1"


def cache_value(key):
    """A value of the build's CMakeCache.txt (the compiler it used)."""
    with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
        for line in f:
            if line.startswith(key + ":"):
                return line.split("=", 1)[1].strip()
    return ""


def sh(args, **kw):
    p = subprocess.run(args, capture_output=True, text=True, timeout=600, **kw)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


class InstallTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="tp-install-")
        cls.prefix = os.path.join(cls.work, "prefix")
        sh(["cmake", "--install", BUILD, "--prefix", cls.prefix])
        cls.cc = cache_value("CMAKE_C_COMPILER") or "cc"
        # A sanitized library needs its program linked with the sanitizers
        # of the same compiler.
        cls.flags = ["-fsanitize=address,undefined"] if SANITIZED else []
        cls.model = os.path.join(cls.work, "model")
        tpe2e.run("make-model", "--arch", "qwen3", "--preset", "tiny", "--seed", "3", "--out", cls.model)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.work, ignore_errors=True)

    def installed(self, *parts):
        return os.path.join(self.prefix, *parts)

    def test_layout(self):
        for p in ("include/tensorpar.h", "include/tensorpar/api.h", "include/tensorpar/comm.h",
                  "lib/libtensorpar.a", "lib/pkgconfig/tensorpar.pc",
                  "lib/cmake/tensorpar/tensorparConfig.cmake", "bin/tensorpar"):
            self.assertTrue(os.path.exists(self.installed(p)), p)

    def pkg_config_build(self):
        env = dict(os.environ, PKG_CONFIG_PATH=self.installed("lib", "pkgconfig"))
        flags = sh(["pkg-config", "--cflags", "--libs", "tensorpar"], env=env).stdout.split()
        self.assertIn("-ltensorpar", flags)
        include = os.path.realpath(self.installed("include"))
        self.assertIn(include, [os.path.realpath(f[2:]) for f in flags if f.startswith("-I")])
        exe = os.path.join(self.work, "from_pretrained_pc")
        sh([self.cc, "-std=c11", "-Wall", "-Wextra", "-Werror", *self.flags, EXAMPLE, "-o", exe, *flags])
        return exe

    def cmake_build(self):
        proj = os.path.join(self.work, "proj")
        os.makedirs(proj, exist_ok=True)
        shutil.copy(EXAMPLE, proj)
        with open(os.path.join(proj, "CMakeLists.txt"), "w") as f:
            f.write("cmake_minimum_required(VERSION 3.25)\n"
                    "project(uses_tensorpar C)\n"
                    "find_package(tensorpar 0.1 REQUIRED)\n"
                    "add_executable(from_pretrained from_pretrained.c)\n"
                    "target_link_libraries(from_pretrained PRIVATE tensorpar::tensorpar)\n")
        build = os.path.join(proj, "build")
        sh(["cmake", "-S", proj, "-B", build, f"-DCMAKE_PREFIX_PATH={self.prefix}",
            f"-DCMAKE_C_COMPILER={self.cc}", f"-DCMAKE_C_FLAGS={' '.join(self.flags)}",
            "-DCMAKE_BUILD_TYPE=Release"])
        sh(["cmake", "--build", build])
        return os.path.join(build, "from_pretrained")

    def generate(self, tp):
        p = tpe2e.run("generate", "--model", self.model, "--tokens", "5,6,7", "--max-new-tokens", "12",
                      "--greedy", "--tp", tp)
        return json.loads(p.stdout)

    def launch(self, exe, n):
        p = sh([self.installed("bin", "tensorpar"), "launch", "-n", str(n), "--", exe, self.model, "5,6,7", "12"],
               env=tpe2e.job_env())
        self.assertIn(f"tp_size {n}", p.stderr)
        return json.loads(p.stdout)

    def test_programs_generate_like_the_cli(self):
        want = self.generate(2)
        self.assertEqual(len(want), 12)
        self.assertEqual(want, self.generate(1))
        for exe in (self.pkg_config_build(), self.cmake_build()):
            with self.subTest(exe=os.path.basename(exe)):
                self.assertEqual(self.launch(exe, 2), want)
        # One process, no launcher: tp_size 1 from the absent WORLD_SIZE.
        p = sh([exe, self.model, "5,6,7", "12"], env=tpe2e.job_env())
        self.assertEqual(json.loads(p.stdout), want)


if __name__ == "__main__":
    unittest.main()
