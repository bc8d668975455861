init_calls = 0


class Context:
    def __init__(self):
        self._initialized = False
        self._context_handle = None

    def ensure_initialized(self):
        global init_calls
        if not self._initialized:
            init_calls += 1
            self._initialized = True
            self._context_handle = object()


_context = None


def context():
    global _context
    if _context is None:
        _context = Context()
    return _context


def context_safe():
    return _context
