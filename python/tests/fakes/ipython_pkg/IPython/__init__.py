"""A stand-in for IPython (tests only, for machines without it): `get_ipython()` and a shell
with the attributes IPython 8 keeps the last traceback and the output cache in
(`InteractiveTB.tb`, `user_ns['_oh']`, `_`/`__`/`___`, `_<n>`, `displayhook`)."""

__version__ = "8.99.0+fake"


class _TB:
    def __init__(self):
        self.tb = None


class _DisplayHook:
    def __init__(self, shell):
        self.shell = shell
        self.prompt_count = 0
        self._ = self.__ = self.___ = ""

    def __call__(self, value):
        self.prompt_count += 1
        ns = self.shell.user_ns
        ns["_oh"][self.prompt_count] = value
        self.___, self.__, self._ = self.__, self._, value
        pushed = {"_": self._, "__": self.__, "___": self.___, f"_{self.prompt_count}": value}
        ns.update(pushed)
        # As IPython's shell.push(..., interactive=False): a second reference, hidden.
        self.shell.user_ns_hidden.update(pushed)


class InteractiveShell:
    def __init__(self):
        self.user_ns = {"_oh": {}, "_": "", "__": "", "___": ""}
        self.user_ns["Out"] = self.user_ns["_oh"]
        self.user_ns_hidden = {}
        self.InteractiveTB = _TB()
        self.SyntaxTB = _TB()
        self.displayhook = _DisplayHook(self)

    def show_error(self):
        import sys

        etype, value, tb = sys.exc_info()
        sys.last_type, sys.last_value, sys.last_traceback = etype, value, tb
        self.InteractiveTB.tb = tb


_shell = None


def get_ipython():
    return _shell


def make_shell():
    global _shell
    _shell = InteractiveShell()
    return _shell
