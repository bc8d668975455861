"""The wire format shared by the agent and its clients (docs/agent.md, "Protocol").

One JSON object per line, UTF-8, in both directions. Every response carries
``"protocol": PROTOCOL`` and ``"ok"``; an error response carries ``"error": {"code",
"message"}``. The limits below are part of the protocol: a client may rely on them.
"""

from __future__ import annotations

import json

# Bumped only for a change an old client would misread; new fields and new ops are
# additive and keep the number (clients ignore fields they do not know).
PROTOCOL = 1

# The largest request line the agent reads, newline included. The largest legitimate
# request is `snapshot` with a path of PATH_MAX (4096) bytes, so 64 KiB is ample.
MAX_REQUEST_BYTES = 64 * 1024
# The largest response line the agent writes, newline included. Lists that could grow
# without bound (pinned segments, their blocks, their stack frames) are capped below so
# that a response stays under it; see trim_to_limit for what happens if one would not.
MAX_RESPONSE_BYTES = 1024 * 1024
# A request line must arrive whole within this many seconds of the agent starting to wait
# for it (after the connection is accepted or the previous response is written); a
# response must be written within it. A slow or silent client loses its connection.
REQUEST_TIMEOUT_S = 10.0
# Connections served at once; one more is answered `busy` and closed.
MAX_CONNECTIONS = 4

# Caps on the lists in a `reclaim` response (each says how many it left out).
MAX_PINNED_SEGMENTS = 32
MAX_BLOCKS_PER_SEGMENT = 4
MAX_FRAMES_PER_BLOCK = 12
MAX_STRING_CHARS = 256

# `snapshot` with `record: "start"`: the bound on `_record_memory_history(max_entries=)`.
DEFAULT_HISTORY_ENTRIES = 100_000
MAX_HISTORY_ENTRIES = 1_000_000

# Client-side defaults (seconds) for the whole exchange of one request.
CLIENT_TIMEOUT_S = {
    "hello": 5.0,
    "stats": 5.0,
    "reset-peak": 5.0,
    "reclaim": 60.0,
    "snapshot": 120.0,
    "oom": 10.0,
}

OPS = ("hello", "stats", "reclaim", "snapshot", "reset-peak", "oom")

# The OOM observer (_oom.py): the largest snapshot it keeps (pickled), and the most bytes
# of it one `oom` answer carries (base64 grows them by 4/3: 512 KiB is ~683 KiB of the
# 1 MiB response line).
MAX_OOM_SNAPSHOT_BYTES = 256 * 1024 * 1024
MAX_OOM_CHUNK_BYTES = 512 * 1024

# Error codes (stable strings; the message is for people).
BAD_JSON = "bad_json"
BAD_REQUEST = "bad_request"
UNKNOWN_OP = "unknown_op"
REQUEST_TOO_LARGE = "request_too_large"
UNSUPPORTED_PROTOCOL = "unsupported_protocol"
PERMISSION_DENIED = "permission_denied"
BUSY = "busy"
CAPTURING = "capturing"
NO_FRAMEWORK = "no_framework"
FRAMEWORK_ERROR = "framework_error"
IO_ERROR = "io_error"
INTERNAL_ERROR = "internal_error"
RESPONSE_TOO_LARGE = "response_too_large"
TIMEOUT = "timeout"


class ProtocolViolation(Exception):
    """A request that cannot be served, with the error code to answer."""

    def __init__(self, code: str, message: str, **extra: object) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = extra


def _reject_constant(name: str) -> object:
    raise ValueError(f"'{name}' is not JSON")


def decode_line(line: bytes) -> object:
    """Parses one line (without its newline); raises ProtocolViolation(BAD_JSON)."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ProtocolViolation(BAD_JSON, f"the line is not UTF-8 ({err.reason} at byte {err.start})")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as err:
        raise ProtocolViolation(BAD_JSON, f"the line is not JSON: {str(err)[:200]}")


def encode_line(obj: object) -> bytes:
    """One JSON line. Lone surrogates (from undecodable file names) become '?': serde_json
    rejects the escaped lone surrogates that json.dumps would otherwise write."""
    text = json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.encode("utf-8", "replace") + b"\n"


def error_response(code: str, message: str, op: object = None, request_id: object = None, **extra: object) -> dict:
    response: dict = {"protocol": PROTOCOL, "ok": False, "op": op}
    if request_id is not None:
        response["id"] = request_id
    response["error"] = {"code": code, "message": message, **extra}
    return response


def trim_to_limit(response: dict, limit: int = MAX_RESPONSE_BYTES) -> bytes:
    """Encodes a response, dropping stack frames and then pinned-segment detail if the line
    would exceed `limit`; says so with `"truncated": true`. The caps above keep the normal
    worst case under the limit, so this is a last line of defence, not the usual path."""
    line = encode_line(response)
    if len(line) <= limit:
        return line
    for device in response.get("devices", []) or []:
        for segment in device.get("pinned_segments", []) or []:
            for block in segment.get("blocks", []) or []:
                if block.get("frames"):
                    block["frames_omitted"] = block.get("frames_omitted", 0) + len(block["frames"])
                    block["frames"] = []
    response["truncated"] = True
    line = encode_line(response)
    if len(line) <= limit:
        return line
    for device in response.get("devices", []) or []:
        segments = device.get("pinned_segments") or []
        if segments:
            device["pinned_segments_omitted"] = device.get("pinned_segments_omitted", 0) + len(segments)
            device["pinned_segments"] = []
    line = encode_line(response)
    if len(line) <= limit:
        return line
    return encode_line(
        error_response(
            RESPONSE_TOO_LARGE,
            f"the answer would be {len(line)} bytes, over the protocol's {limit}",
            op=response.get("op"),
            request_id=response.get("id"),
        )
    )
