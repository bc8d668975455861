"""The three ways to start the agent besides start(): the .pth hook with VRAMCTL_AGENT=1
(from the wheel the project's build makes, and from pip installing ./python), and the
IPython extension, with `reclaim` `deep` in a shell (a stand-in, and the real IPython where
installed)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import zipfile

from harness import GiB, PYTHON_DIR, Target, client, fake_path

sys.path.insert(0, PYTHON_DIR)
import build_wheel  # noqa: E402


class PthTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.base = tempfile.mkdtemp(prefix="vramctl-test-userbase-")
        site = subprocess.run(
            [sys.executable, "-c", "import site; print(site.getusersitepackages())"],
            env=dict(os.environ, PYTHONUSERBASE=cls.base),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        os.makedirs(site)
        wheel = build_wheel.build_wheel(cls.base)
        # Installing a pure wheel is unpacking it into site-packages.
        with zipfile.ZipFile(os.path.join(cls.base, wheel)) as archive:
            archive.extractall(site)
        cls.site = site

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.base, ignore_errors=True)

    def target(self, agent: str | None = "1", fakes: tuple = ("torch",)) -> Target:
        # The package comes from the installed wheel only, not from the checkout.
        env = {"PYTHONNOUSERSITE": None, "PYTHONUSERBASE": self.base, "VRAMCTL_AGENT": agent}
        return Target(env=env, pythonpath=fake_path(*fakes))

    def test_the_wheel_puts_the_hook_at_the_root_of_site_packages(self) -> None:
        self.assertTrue(os.path.isfile(os.path.join(self.site, "vramctl_agent.pth")))
        self.assertTrue(os.path.isfile(os.path.join(self.site, "vramctl_agent", "__init__.py")))

    def test_the_wheel_is_reproducible(self) -> None:
        with tempfile.TemporaryDirectory() as one, tempfile.TemporaryDirectory() as two:
            a, b = build_wheel.build_wheel(one), build_wheel.build_wheel(two)
            with open(os.path.join(one, a), "rb") as x, open(os.path.join(two, b), "rb") as y:
                self.assertEqual(x.read(), y.read())

    def test_vramctl_agent_1_starts_the_agent_once_torch_is_imported_and_not_before(self) -> None:
        with self.target() as t:
            self.assertEqual(t.run("import sys", "'torch' in sys.modules"), False)
            self.assertEqual(t.run("import vramctl_agent", "vramctl_agent.is_running()"), False)
            self.assertFalse(os.path.exists(os.path.join(t.runtime_dir, "vramctl")))
            self.assertTrue(t.run("", "vramctl_agent.__file__.startswith(%r)" % self.site))
            t.run("import torch")
            self.assertTrue(t.run("", "vramctl_agent.is_running()"))
            hello = client.request(t.pid, "hello")
            self.assertEqual(hello["started_by"], "env")
            self.assertTrue(hello["frameworks"][0]["capture_guard"])
            # The hook is gone and torch's module looks as if it had never been there.
            self.assertEqual(t.run("", "type(torch.__loader__).__name__"), "SourceFileLoader")
            self.assertEqual(t.run("", "type(torch.__spec__.loader).__name__"), "SourceFileLoader")
            self.assertEqual(t.run("", "[type(f).__name__ for f in sys.meta_path if type(f).__module__.startswith('vramctl_agent')]"), [])

    def test_without_vramctl_agent_nothing_is_imported_or_started(self) -> None:
        for value in (None, "0", "yes"):
            with self.subTest(VRAMCTL_AGENT=value), self.target(agent=value) as t:
                t.run("import sys, torch")
                self.assertEqual(t.run("", "'vramctl_agent' in sys.modules"), False)
                self.assertFalse(os.path.exists(os.path.join(t.runtime_dir, "vramctl")))

    def test_the_hook_never_imports_torch_itself(self) -> None:
        with self.target() as t:
            t.run("import json, collections, sys")
            self.assertEqual(t.run("", "[m for m in ('torch', 'jax', 'tensorflow') if m in sys.modules]"), [])
            self.assertEqual(t.finish(), 0)
            self.assertFalse(os.path.exists(os.path.join(t.runtime_dir, "vramctl")))

    def test_jax_or_tensorflow_starts_it_too(self) -> None:
        for name in ("jax", "tensorflow"):
            with self.subTest(framework=name), self.target(fakes=(name,)) as t:
                t.run(f"import {name}")
                self.assertEqual(client.request(t.pid, "hello")["frameworks"][0]["name"], name)

    def test_pip_installs_the_package_and_its_hook_without_network(self) -> None:
        if importlib.util.find_spec("pip") is None:
            self.skipTest("pip is not installed")
        with tempfile.TemporaryDirectory() as target:
            done = subprocess.run(
                [sys.executable, "-m", "pip", "install", "--no-index", "--disable-pip-version-check", "--target", target, PYTHON_DIR],
                capture_output=True,
                text=True,
                timeout=300,
            )
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertTrue(os.path.isfile(os.path.join(target, "vramctl_agent.pth")))
            # A site directory with it processes the hook.
            check = subprocess.run(
                [sys.executable, "-c", "import site, sys; site.addsitedir(sys.argv[1]); import torch, vramctl_agent; print(vramctl_agent.is_running())", target],
                env=dict(os.environ, VRAMCTL_AGENT="1", PYTHONPATH=os.pathsep.join(fake_path("torch")), XDG_RUNTIME_DIR=target),
                capture_output=True,
                text=True,
                timeout=60,
            )
            self.assertEqual(check.stdout.strip(), "True", check.stderr)


class IPythonTest(unittest.TestCase):
    CELLS = (
        "import torch, sys, IPython, vramctl_agent\n"
        f"GiB = {GiB}\n"
        "shell = IPython.make_shell()\n"
        "vramctl_agent.load_ipython_extension(shell)\n"
    )

    def test_load_ext_starts_the_agent_and_unload_stops_it(self) -> None:
        with Target(fakes=("torch", "ipython")) as t:
            t.run(self.CELLS)
            hello = client.request(t.pid, "hello")
            self.assertEqual(hello["started_by"], "ipython")
            self.assertTrue(hello["ipython"])
            t.run("vramctl_agent.unload_ipython_extension(shell)")
            self.assertFalse(t.run("", "vramctl_agent.is_running()"))

    def test_deep_drops_the_shells_last_traceback_and_output_cache(self) -> None:
        with Target(fakes=("torch", "ipython")) as t:
            t.run(
                self.CELLS
                + "shell.displayhook(torch.empty(GiB, dtype=torch.uint8, device='cuda'))\n"
                + "shell.displayhook(torch.empty(2 * GiB, dtype=torch.uint8, device='cuda'))\n"
                + "def cell():\n    hidden = torch.empty(4 * GiB, dtype=torch.uint8, device='cuda')\n    1 / 0\n"
                + "try:\n    cell()\nexcept ZeroDivisionError:\n    shell.show_error()\n"
            )
            self.assertEqual(client.request(t.pid, "reclaim", gc=True)["released_bytes"], 0)
            answer = client.request(t.pid, "reclaim", deep=True)
            self.assertTrue(answer["deep"]["in_ipython"])
            dropped = {d["what"]: d for d in answer["deep"]["dropped"]}
            self.assertEqual(dropped["last_exception"]["detail"], "ZeroDivisionError: division by zero")
            self.assertEqual(dropped["output_cache"]["entries"], 2)
            self.assertEqual(dropped["output_cache"]["names"], ["Out", "_", "__", "_1", "_2"])
            self.assertIn("InteractiveTB.tb", dropped["last_exception"]["names"])
            self.assertEqual((dropped["last_exception"]["tensors"], dropped["last_exception"]["tensor_bytes"]), (1, 4 * GiB))
            self.assertEqual(answer["released_bytes"], 7 * GiB)
            self.assertIsNone(t.run("", "shell.InteractiveTB.tb"))
            self.assertEqual(t.run("", "(len(shell.user_ns['_oh']), shell.user_ns['_'], '_1' in shell.user_ns)"), [0, "", False])

    def test_with_the_real_ipython(self) -> None:
        with Target(fakes=("torch",), pythonpath=[PYTHON_DIR] + fake_path("torch") + [p for p in sys.path if p.endswith("site-packages")]) as t:
            if not t.run("import importlib.util", "importlib.util.find_spec('IPython') is not None"):
                self.skipTest("IPython is not installed")
            t.run(
                "from IPython.core.interactiveshell import InteractiveShell\n"
                "import io, contextlib\n"
                "shell = InteractiveShell.instance()\n"
                "out = io.StringIO()\n"
                "def cell(code):\n"
                "    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):\n"
                "        shell.run_cell(code, store_history=True)\n"
                "cell('%load_ext vramctl_agent')\n"
                f"cell('import torch\\nGiB = {GiB}')\n"
                "cell('torch.empty(GiB, dtype=torch.uint8, device=\"cuda\")')\n"
                "cell('def f():\\n    x = torch.empty(2 * GiB, dtype=torch.uint8, device=\"cuda\")\\n    1 / 0\\nf()')\n"
            )
            self.assertIn("vramctl agent: listening on", t.run("", "out.getvalue()"))
            answer = client.request(t.pid, "reclaim", deep=True)
            dropped = {d["what"]: d for d in answer["deep"]["dropped"]}
            self.assertEqual(set(dropped), {"last_exception", "output_cache"}, answer["deep"])
            self.assertEqual(answer["released_bytes"], 3 * GiB)


if __name__ == "__main__":
    unittest.main()
