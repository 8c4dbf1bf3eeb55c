"""The .deb route as README's deploy section gives it: cpack -G DEB from the
build tree, the packages unpacked into a scratch root (dpkg-deb -x; their
control fields read with dpkg-deb -f/-e). Checks what `apt install` would
put where: everything under /usr and /etc, the unit's ExecStart binary and
--config file in the package, the conffile, the daemon package free of
torch, and Debian's python3 importing the package (and running its hook and
adapter) from that root's dist-packages."""
import glob
import os
import shutil
import subprocess
import sys
import unittest

WORK = os.path.join(os.environ["OPGUARD_PACKAGE_WORK"], "deb")
BUILD = os.environ["OPGUARD_BUILD_DIR"]


def run(cmd, **kwargs):
    result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        raise AssertionError(f"{cmd} failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
                             f"{result.stderr[-3000:]}")
    return result.stdout


def field(deb, name):
    return run(["dpkg-deb", "-f", deb, name]).strip()


class Deb(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        shutil.rmtree(WORK, ignore_errors=True)
        os.makedirs(WORK)
        run(["cpack", "-G", "DEB", "--config", os.path.join(BUILD, "CPackConfig.cmake"),
             "-B", WORK], cwd=BUILD, timeout=900)
        cls.debs = {field(deb, "Package"): deb for deb in glob.glob(os.path.join(WORK, "*.deb"))}
        cls.root = os.path.join(WORK, "root")
        for deb in cls.debs.values():
            run(["dpkg-deb", "-x", deb, cls.root])

    def path(self, absolute):
        return os.path.join(self.root, absolute.lstrip("/"))

    def test_two_packages_and_the_readme_glob_names_the_daemon_one(self):
        self.assertEqual(sorted(self.debs), ["opguard", "opguard-torch"])
        self.assertEqual(glob.glob(os.path.join(WORK, "opguard_*.deb")), [self.debs["opguard"]])

    def test_every_file_is_under_usr_or_etc(self):
        for package, deb in self.debs.items():
            for line in run(["dpkg-deb", "-c", deb]).splitlines():
                path = line.split()[5]
                self.assertTrue(path in ("./", "./usr/", "./etc/") or
                                path.startswith(("./usr/", "./etc/")), f"{package}: {path}")

    def test_unit_names_files_the_package_holds(self):
        unit = self.path("/usr/lib/systemd/system/opguardd.service")
        with open(unit) as f:
            text = f.read()
        exec_start = next(l for l in text.splitlines() if l.startswith("ExecStart="))
        argv = exec_start[len("ExecStart="):].split()
        self.assertEqual(argv[0], "/usr/sbin/opguardd")
        self.assertTrue(os.access(self.path(argv[0]), os.X_OK), argv[0])
        self.assertEqual(argv[1:], ["--config", "/etc/opguard/opguardd.conf"])
        self.assertTrue(os.path.isfile(self.path(argv[2])))
        self.assertNotIn("/usr/local", text)

    def test_config_is_a_conffile_and_maintainer_scripts_name_real_paths(self):
        control = os.path.join(WORK, "control-opguard")
        run(["dpkg-deb", "-e", self.debs["opguard"], control])
        with open(os.path.join(control, "conffiles")) as f:
            self.assertEqual(f.read().split(), ["/etc/opguard/opguardd.conf"])
        with open(os.path.join(control, "postinst")) as f:
            postinst = f.read()
        for snippet in ("/usr/lib/sysusers.d/opguard.conf", "/usr/lib/tmpfiles.d/opguard.conf"):
            self.assertIn(snippet, postinst)
            self.assertTrue(os.path.isfile(self.path(snippet)), snippet)

    def test_daemon_package_does_not_depend_on_torch(self):
        depends = field(self.debs["opguard"], "Depends")
        self.assertIn("libzmq5", depends)
        self.assertNotIn("torch", depends)
        self.assertNotIn("python", depends)
        for binary in ("/usr/sbin/opguardd", "/usr/bin/opguard"):
            self.assertTrue(os.access(self.path(binary), os.X_OK), binary)
        self.assertTrue(glob.glob(self.path("/usr/lib/libopguard_shim.so*")) or
                        glob.glob(self.path("/usr/lib/*/libopguard_shim.so*")))
        # The Python package and the adapter are opguard-torch's.
        self.assertNotIn("python3", run(["dpkg-deb", "-c", self.debs["opguard"]]))

    def test_opguard_exec_preloads_the_packaged_nccl_interposer(self):
        out = run([self.path("/usr/bin/opguard"), "exec", "--", "sh", "-c", 'echo "$LD_PRELOAD"'])
        library = out.strip()
        self.assertTrue(library.startswith(os.path.realpath(self.root) + "/usr/lib/"), library)
        self.assertTrue(library.endswith("/libopguard_nccl.so"), library)

    def test_torch_package_depends_on_debian_torch(self):
        depends = field(self.debs["opguard-torch"], "Depends")
        self.assertIn("libtorch", depends)
        self.assertIn("python3-torch", depends)

    def test_debian_python_imports_the_package_and_runs_its_hook(self):
        dist = glob.glob(self.path("/usr/lib/python3*/dist-packages"))
        self.assertEqual(len(dist), 1, dist)
        # site.addsitedir processes .pth files as at start-up for a site folder.
        probe = (f"import site, sys; site.addsitedir({dist[0]!r})\n"
                 "import opguard, torch\n"
                 "from opguard import _native\n"
                 "_native.check_torch(torch.__version__); _native.load()\n"
                 "print(opguard.__file__, 'opguard._autoload' in sys.modules)\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPGUARD", "PYTHON"))}
        out = run(["/usr/bin/python3", "-c", probe], env=dict(env, OPGUARD="1")).split()
        self.assertEqual(out, [os.path.join(dist[0], "opguard", "__init__.py"), "True"])


if __name__ == "__main__":
    unittest.main()
