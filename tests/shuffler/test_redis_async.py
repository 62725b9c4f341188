"""crowdmix.shuffler.redis_async against a real redis-server: the event loop's connection
(redis.asyncio) for the group commit's one command, through a synchronous facade.

The connection's streams belong to the event loop that opened them, so each client
keeps one loop for its whole life (``asyncio.Runner``, the reusable form of
``asyncio.run``) and every call is ``runner.run(connection.eval(...))``. These tests
use ``redis://``; the store contract suite runs the same connection over
``rediss://`` and ``unix://`` too (tests/shuffler/test_store_contract.py).
"""

from __future__ import annotations

import asyncio
import os
import select
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Coroutine, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, TypeVar
from urllib.parse import quote, urlsplit

import pytest
import redis

from crowdmix.shuffler.errors import StoreOutcomeUnknown, StoreUnavailable
from crowdmix.shuffler.redis_async import AsyncScriptConnection
from tests.redis_server import RedisServer, free_port

T = TypeVar("T")
Reply = bytes | int | None

RETURN_ONE = "return 1"
INCR = "return redis.call('INCR', KEYS[1])"
SET = "return redis.call('SET', KEYS[1], ARGV[1])"
# Busy for ARGV[1] microseconds of server time: a reply that comes after the client gave up.
BUSY = """
local t0 = redis.call('TIME')
local start = t0[1] * 1000000 + t0[2]
while true do
  local t = redis.call('TIME')
  if t[1] * 1000000 + t[2] - start >= tonumber(ARGV[1]) then break end
end
return 'slow'
"""
PASSWORD = "s3cret-pass"


def url_of(
    port: int, *, db: int = 0, username: str | None = None, password: str | None = None
) -> str:
    auth = ""
    if password is not None:
        auth = f"{quote(username or '', safe='')}:{quote(password, safe='')}@"
    return f"redis://{auth}127.0.0.1:{port}/{db}"


class Client:
    def __init__(self, connection: AsyncScriptConnection) -> None:
        self.connection = connection
        self._runner = asyncio.Runner()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._runner.run(coro)

    def eval(self, script: str, keys: Sequence[bytes] = (), args: Sequence[bytes] = ()) -> Any:
        return self.run(self.connection.eval(script, list(keys), list(args)))

    def transaction(self, *commands: Sequence[Any]) -> Any:
        return self.run(self.connection.transaction(commands))

    def close(self) -> None:
        try:
            self.run(self.connection.aclose())
        finally:
            self._runner.close()


class Connect(Protocol):
    def __call__(
        self,
        port: int,
        *,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        timeout: float = 5.0,
    ) -> Client: ...


@pytest.fixture
def connect() -> Iterator[Connect]:
    """Opens clients on 127.0.0.1; all are closed at teardown."""
    made: list[Client] = []

    def make(
        port: int,
        *,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        timeout: float = 5.0,
    ) -> Client:
        url = url_of(port, db=db, username=username, password=password)
        client = Client(AsyncScriptConnection(url, timeout=timeout))
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def port_of(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


@pytest.fixture
def r(redis_url: str) -> Iterator[Any]:
    """redis-py on the shared server, db 0: the independent view of what reached Redis."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def calls(r: Any, command: str) -> tuple[int, int]:
    """(calls, failed_calls) of ``command`` so far, from INFO commandstats."""
    stats = r.info("commandstats").get(f"cmdstat_{command}", {})
    return int(stats.get("calls", 0)), int(stats.get("failed_calls", 0))


def connections_received(r: Any) -> int:
    return int(r.info("stats")["total_connections_received"])


class SilentServer:
    """A TCP listener on 127.0.0.1:0 that accepts and reads, and never answers."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.received = threading.Event()  # a client sent something
        self.closed_by_client = threading.Event()  # a client closed its connection
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        conns: list[socket.socket] = []
        try:
            while not self._stop.is_set():
                readable, _, _ = select.select([self._listener, *conns], [], [], 0.05)
                for s in readable:
                    if s is self._listener:
                        conns.append(self._listener.accept()[0])
                    elif s.recv(65536):
                        self.received.set()
                    else:
                        self.closed_by_client.set()
                        conns.remove(s)
                        s.close()
        finally:
            for s in conns:
                s.close()

    def __enter__(self) -> SilentServer:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._listener.close()


@pytest.fixture(scope="module")
def password_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A redis-server with ``--requirepass PASSWORD`` (RedisServer takes no extra
    arguments) and an ACL user ``shuffler``/``user-pass``; yields its port."""
    exe = shutil.which("redis-server")
    assert exe is not None, "redis-server is not installed: run scripts/bootstrap"
    directory: Path = tmp_path_factory.mktemp("redis-auth")
    port = free_port()
    args = [
        exe,
        "--bind", "127.0.0.1",
        "--port", str(port),
        "--dir", str(directory),
        "--save", "",
        "--appendonly", "no",
        "--protected-mode", "no",
        "--requirepass", PASSWORD,
        "--logfile", str(directory / "redis.log"),
    ]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    admin: Any = redis.Redis(host="127.0.0.1", port=port, password=PASSWORD, socket_timeout=5)
    try:
        deadline = time.monotonic() + 10
        while True:
            if proc.poll() is not None:
                log = (directory / "redis.log").read_text(errors="replace")[-2000:]
                pytest.fail(f"redis-server exited with {proc.returncode}: {log}")
            try:
                admin.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    pytest.fail(f"redis-server did not answer on port {port}")
                time.sleep(0.05)
        admin.execute_command("ACL", "SETUSER", "shuffler", "on", ">user-pass", "~*", "+@all")
        yield port
    finally:
        admin.close()
        proc.kill()
        proc.wait(timeout=10)


# --- replies and arguments --------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("return 42", 42),
        ("return -7", -7),
        ("return 9007199254740993", 9007199254740992),  # a Lua double, truncated by Redis
        ("return 'hello'", b"hello"),
        ("return ''", b""),
        ("return nil", None),
        ("return false", None),
        ("return redis.status_reply('QUEUED')", b"QUEUED"),
        ("return {ok='FINE'}", b"FINE"),
    ],
)
def test_reply_kinds(connect: Connect, redis_url: str, script: str, expected: Reply) -> None:
    client = connect(port_of(redis_url))
    assert client.eval(script) == expected
    assert client.eval(script) == expected  # again, now by EVALSHA on the same connection


def test_keys_and_args_reach_redis_byte_exact(connect: Connect, redis_url: str, r: Any) -> None:
    client = connect(port_of(redis_url))
    blob = bytes(range(256)) + b"\r\n$-1\r\n*2\r\n"  # binary, and RESP look-alikes
    script = """
    redis.call('SET', KEYS[1], ARGV[1])
    return redis.call('RPUSH', KEYS[2], ARGV[2], ARGV[3])
    """
    assert client.eval(script, [b"blob", b"list"], [blob, b"", b"tail"]) == 2
    assert r.get(b"blob") == blob
    assert r.lrange(b"list", 0, -1) == [b"", b"tail"]
    # A bulk reply that itself holds CRLF and RESP look-alikes.
    assert client.eval("return ARGV[1]", [], [blob]) == blob
    assert client.eval(INCR, [b"counter"]) == 1
    assert client.eval(INCR, [b"counter"]) == 2
    assert r.get(b"counter") == b"2"


def test_a_transaction_runs_every_command_and_returns_their_replies(
    connect: Connect, redis_url: str, r: Any
) -> None:
    client = connect(port_of(redis_url))
    blob = bytes(range(256)) * 4096 + b"\r\n*2\r\n"  # a megabyte, with RESP look-alikes
    replies = client.transaction(
        (b"RPUSH", b"q", blob), (b"RPUSH", b"qn", b"7"), (b"HINCRBY", b"p", b"f", b"7")
    )
    assert replies == [1, 1, 7]
    assert (r.lrange(b"q", 0, -1), r.hget(b"p", b"f")) == ([blob], b"7")
    assert client.transaction((b"HINCRBY", b"p", b"f", b"3")) == [10]  # the connection goes on


def test_a_command_refused_while_queued_aborts_the_transaction(
    connect: Connect, redis_url: str, r: Any
) -> None:
    """Redis refuses the command as it queues it: nothing of the transaction runs, so the
    error is the retryable one (StoreUnavailable, not its subclass StoreOutcomeUnknown)."""
    client = connect(port_of(redis_url))
    with pytest.raises(StoreUnavailable) as refused:
        client.transaction((b"RPUSH", b"q", b"x"), (b"HINCRBY", b"p", b"f"))  # wrong arity
    assert not isinstance(refused.value, StoreOutcomeUnknown)
    assert "wrong number of arguments" in str(refused.value)
    assert not r.exists(b"q")
    assert client.transaction((b"RPUSH", b"q", b"y")) == [1]


def test_a_command_failing_inside_exec_is_an_unknown_outcome(
    connect: Connect, redis_url: str, r: Any
) -> None:
    """A command that fails as EXEC runs it (a key of another type): the commands before it
    wrote, so the outcome is StoreOutcomeUnknown, never "nothing was stored"."""
    client = connect(port_of(redis_url))
    r.set(b"not-a-list", b"x")
    with pytest.raises(StoreOutcomeUnknown, match="WRONGTYPE"):
        client.transaction((b"RPUSH", b"q", b"x"), (b"RPUSH", b"not-a-list", b"y"))
    assert r.lrange(b"q", 0, -1) == [b"x"]


def test_a_refused_multi_is_an_unknown_outcome(connect: Connect, redis_url: str, r: Any) -> None:
    """Redis refuses MULTI (here: an ACL without it): the commands sent behind it then run
    one by one, outside any transaction, and EXEC fails ("without MULTI"). They wrote, so
    the outcome is StoreOutcomeUnknown, never "nothing was stored"."""
    r.execute_command("ACL", "SETUSER", "no-multi", "on", ">no-multi-pass", "+@all", "-multi", "~*")
    try:
        client = connect(port_of(redis_url), username="no-multi", password="no-multi-pass")
        with pytest.raises(StoreOutcomeUnknown, match="multi"):
            client.transaction((b"RPUSH", b"q", b"x"), (b"HINCRBY", b"p", b"f", b"1"))
        assert (r.lrange(b"q", 0, -1), r.hget(b"p", b"f")) == ([b"x"], b"1")
    finally:
        r.execute_command("ACL", "DELUSER", "no-multi")


def test_megabyte_argument_round_trips(connect: Connect, redis_url: str, r: Any) -> None:
    client = connect(port_of(redis_url))
    big = bytes(range(256)) * 4096  # 1 MiB
    assert client.eval("return string.len(ARGV[1])", [], [big]) == len(big)
    assert client.eval("return ARGV[1]", [], [big]) == big  # and a 1 MiB bulk reply
    assert client.eval(SET, [b"big"], [big]) == b"OK"
    assert r.get(b"big") == big


def test_db_selection(connect: Connect, redis_url: str) -> None:
    client = connect(port_of(redis_url), db=3)
    assert client.eval(SET, [b"where"], [b"db3"]) == b"OK"
    db3 = redis.Redis(host="127.0.0.1", port=port_of(redis_url), db=3)
    db0 = redis.Redis(host="127.0.0.1", port=port_of(redis_url), db=0)
    try:
        assert db3.get(b"where") == b"db3"
        assert db0.get(b"where") is None
    finally:
        db3.close()
        db0.close()


# --- script cache ---------------------------------------------------------------------


def test_noscript_loads_the_script_again_once(connect: Connect, redis_url: str, r: Any) -> None:
    client = connect(port_of(redis_url))
    assert client.eval(INCR, [b"n"]) == 1
    r.script_flush()

    evalsha0, evalsha_failed0 = calls(r, "evalsha")
    eval0, _ = calls(r, "eval")
    assert client.eval(INCR, [b"n"]) == 2  # EVALSHA → NOSCRIPT → SCRIPT LOAD → EVALSHA
    evalsha1, evalsha_failed1 = calls(r, "evalsha")
    assert (evalsha1 - evalsha0, evalsha_failed1 - evalsha_failed0) == (2, 1)

    assert client.eval(INCR, [b"n"]) == 3  # loaded again: EVALSHA alone
    evalsha2, evalsha_failed2 = calls(r, "evalsha")
    eval2, _ = calls(r, "eval")
    assert (evalsha2 - evalsha1, evalsha_failed2 - evalsha_failed1) == (1, 0)
    assert eval2 == eval0  # never the script's source on every call
    assert r.get(b"n") == b"3"  # the NOSCRIPT call ran the script exactly once


# --- errors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("return redis.error_reply('boom')", "redis: ERR boom"),
        ("return redis.call('INCR', KEYS[1])", "redis: WRONGTYPE Operation against a key"),
        ("return redis.call('NO-SUCH-COMMAND')", "redis: ERR Unknown Redis command"),
        ("this is not lua", "redis: ERR Error compiling script"),
    ],
)
def test_script_error_raises_and_connection_stays_usable(
    connect: Connect, redis_url: str, r: Any, script: str, message: str
) -> None:
    client = connect(port_of(redis_url))
    r.rpush(b"a-list", b"x")
    assert client.eval(RETURN_ONE) == 1
    connections = connections_received(r)
    with pytest.raises(StoreUnavailable) as raised:
        client.eval(script, [b"a-list"])
    assert str(raised.value).startswith(message)
    assert client.eval(INCR, [b"after"]) == 1
    assert connections_received(r) == connections  # the same connection, no reconnect


def test_array_reply(connect: Connect, redis_url: str) -> None:
    client = connect(port_of(redis_url))
    assert client.eval("return {1, 'two', 3}") == [1, b"two", 3]
    assert client.eval("return 'next'") == b"next"


def test_reply_after_timeout_is_not_read_by_the_next_call(
    connect: Connect, redis_url: str, r: Any
) -> None:
    client = connect(port_of(redis_url), timeout=0.2)
    # the script was sent and ran: "may have been stored", not "nothing stored"
    with pytest.raises(StoreOutcomeUnknown, match="TimeoutError"):
        client.eval(BUSY, [], [b"600000"])  # Redis answers 'slow' ~0.4 s after the client gave up
    r.ping()  # returns once the script is done, so the late reply has been sent by now
    assert client.eval("return 'fast'") == b"fast"


# --- the server goes away -----------------------------------------------------------


def test_redis_stopped_then_started_again(connect: Connect, private_redis: RedisServer) -> None:
    client = connect(private_redis.port)
    assert client.eval(INCR, [b"n"]) == 1
    private_redis.stop()
    # The open connection was closed by the server: noticed before sending (so the
    # error is the retryable "nothing stored" one), not by the timeout.
    with pytest.raises(StoreUnavailable) as raised:
        client.eval(INCR, [b"n"])
    assert "TimeoutError" not in str(raised.value)
    assert not isinstance(raised.value, StoreOutcomeUnknown)
    # Nothing listens now: the reconnect is refused.
    with pytest.raises(StoreUnavailable, match="Error 111 connecting"):  # refused
        client.eval(INCR, [b"n"])
    private_redis.start()
    assert client.eval(INCR, [b"n"]) == 2  # reconnected; a clean SHUTDOWN kept the AOF
    assert client.eval(INCR, [b"n"]) == 3


def test_silent_server_times_out(connect: Connect) -> None:
    with SilentServer() as server:
        client = connect(server.port, timeout=0.5)
        started = time.monotonic()
        # redis-py opens a connection with a handshake (CLIENT SETINFO) that is never
        # answered here, so the script itself was never sent: the retryable error
        with pytest.raises(StoreUnavailable, match="TimeoutError") as raised:
            client.eval(RETURN_ONE)
        assert not isinstance(raised.value, StoreOutcomeUnknown)
        assert time.monotonic() - started < 10
        assert server.received.wait(5)  # the handshake went out; the answer never came
        # The connection is closed, not kept for a next call to read a stale reply from.
        assert server.closed_by_client.wait(5)


# --- authentication -----------------------------------------------------------------


def test_password_auth(connect: Connect, password_redis: int) -> None:
    client = connect(password_redis, password=PASSWORD, db=2)
    assert client.eval(SET, [b"authed"], [b"yes"]) == b"OK"
    check = redis.Redis(host="127.0.0.1", port=password_redis, password=PASSWORD, db=2)
    try:
        assert check.get(b"authed") == b"yes"  # AUTH, then SELECT 2
    finally:
        check.close()


def test_acl_user_auth(connect: Connect, password_redis: int) -> None:
    client = connect(password_redis, username="shuffler", password="user-pass")
    assert client.eval(RETURN_ONE) == 1
    wrong = connect(password_redis, username="shuffler", password=PASSWORD)
    with pytest.raises(StoreUnavailable, match="WRONGPASS"):
        wrong.eval(RETURN_ONE)


def test_wrong_or_missing_password_raises(connect: Connect, password_redis: int) -> None:
    wrong = connect(password_redis, password="not-the-password")
    with pytest.raises(StoreUnavailable, match="WRONGPASS"):
        wrong.eval(SET, [b"wrong"], [b"x"])
    with pytest.raises(StoreUnavailable):
        wrong.eval(SET, [b"wrong"], [b"x"])  # still refused on the next call
    missing = connect(password_redis)
    with pytest.raises(StoreUnavailable, match="NOAUTH") as raised:
        missing.eval(SET, [b"wrong"], [b"x"])
    # an error reply (redis-py raises it as a connection error): refused, so it did not run
    assert not isinstance(raised.value, StoreOutcomeUnknown)
    check = redis.Redis(host="127.0.0.1", port=password_redis, password=PASSWORD)
    try:
        assert check.get(b"wrong") is None
    finally:
        check.close()


def test_failed_login_is_not_reused(connect: Connect, redis_url: str, r: Any) -> None:
    client = connect(port_of(redis_url), db=99)  # the server has 16 databases
    with pytest.raises(StoreUnavailable, match="DB index is out of range"):
        client.eval(SET, [b"misplaced"], [b"x"])
    with pytest.raises(StoreUnavailable, match="DB index is out of range"):
        client.eval(SET, [b"misplaced"], [b"x"])
    assert r.get(b"misplaced") is None


# --- callers that do not serialize ----------------------------------------------------


def test_async_connection_serializes_tasks(redis_url: str) -> None:
    client = Client(AsyncScriptConnection(redis_url))

    async def burst() -> list[Reply]:
        return await asyncio.gather(*(client.connection.eval(INCR, [b"n"], []) for _ in range(200)))

    try:
        replies = client.run(burst())
    finally:
        client.close()
    assert sorted(r for r in replies if isinstance(r, int)) == list(range(1, 201))


def test_async_cancelled_call_closes_its_connection() -> None:
    with SilentServer() as server:
        client = Client(AsyncScriptConnection(url_of(server.port), timeout=30))

        async def cancel_midway() -> None:
            task = asyncio.create_task(client.connection.eval(RETURN_ONE, [], []))
            assert await asyncio.to_thread(server.received.wait, 5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # A half-read reply must not be left for the next call to read.
            assert await asyncio.to_thread(server.closed_by_client.wait, 5)

        try:
            client.run(cancel_midway())
        finally:
            client.close()


def test_a_connection_on_a_descriptor_above_1024_works(
    connect: Connect, private_redis: RedisServer
) -> None:
    """A shuffler holding many client connections gets socket descriptors past select()'s
    FD_SETSIZE: the liveness check before each call must not refuse them."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1300:
        pytest.skip(f"the descriptor limit ({hard}) is below 1300")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1300), hard))
    held = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        client = connect(private_redis.port)
        assert client.eval(INCR, [b"fd"]) == 1  # connects: its socket's descriptor > 1100
        assert client.eval(INCR, [b"fd"]) == 2  # the liveness check runs on it
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
