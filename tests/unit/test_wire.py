"""LeanParser reads what nats-py's parser reads: the same messages and commands, in the same
order, however the byte stream is cut into reads."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from nats.errors import ProtocolError
from nats.protocol.parser import Parser

from app.nats.wire import LeanParser

RAW_SID = 7  # a subscription with a raw callback (the reply mux's inbox)


class Recorder:
    """Stands in for nats-py's client: records what the parser hands it."""

    def __init__(self, raw: bool) -> None:
        self.events: list[tuple[Any, ...]] = []
        self._raw_handlers = {RAW_SID: self._raw} if raw else {}

    def _raw(self, subject: bytes, headers: bytes | None, payload: bytes) -> None:
        self.events.append(("msg", RAW_SID, subject, b"", payload, headers))

    async def _process_msg(
        self, sid: int, subject: bytes, reply: bytes, payload: bytes, headers: bytes | None
    ) -> None:
        if sid == RAW_SID:  # nats-py's path for it (LeanClient._process_msg)
            self.events.append(("msg", sid, subject, b"", payload, headers))
        else:
            self.events.append(("msg", sid, subject, reply, payload, headers))

    async def _process_ping(self) -> None:
        self.events.append(("ping",))

    async def _process_pong(self) -> None:
        self.events.append(("pong",))

    async def _process_info(self, info: dict[str, Any]) -> None:
        self.events.append(("info", info))

    async def _process_err(self, message: str) -> None:
        self.events.append(("err", message))


def _command(rnd: random.Random, odd: bool = True) -> bytes:
    """One protocol command; with ``odd``, sometimes in a form only nats-py's parser reads, or
    one it refuses."""
    kind = rnd.random()
    if kind < 0.05:
        return rnd.choice([b"PING\r\n", b"PONG\r\n", b"+OK\r\n", b"-ERR 'Stale Connection'\r\n"])
    if kind < 0.07:
        return b"INFO " + json.dumps({"server_id": "x", "n": rnd.randint(0, 9)}).encode() + b"\r\n"
    if odd and kind < 0.075:
        return rnd.choice([b"BOGUS\r\n", b"MSG a 1 x\r\n", b"MSG a 1 " + b"9" * 4400 + b"\r\n"])
    sid = rnd.choice([RAW_SID, 1, 12])
    subject = rnd.choice([b"_INBOX.abc.1f", b"$KV.b.k1", b"a.b.c"])
    if odd and rnd.random() < 0.01:
        subject = rnd.choice([b"a\tb.c", b"a\x0bb", b"a\x0cb"])  # nats-py splits there
    reply = rnd.choice([b"", b"", b"$JS.ACK.s.c.1.2.3.4.0", b"17"])
    payload = rnd.randbytes(rnd.choice([0, 1, 5, 100, 3000, 70_000] if odd else [0, 5, 100]))
    if rnd.random() < 0.2:
        payload += b"\r\nMSG x 1 3\r\nabc\r\n"  # protocol-looking bytes inside a payload
    headers = b""
    form = rnd.random()
    if form < 0.5:
        headers = b"NATS/1.0" + rnd.choice([b"", b" 404 Message Not Found"]) + b"\r\n"
        headers += b"Nats-Sequence: 12\r\nKV-Operation: DEL\r\n\r\n"
    elif form < 0.6:
        headers = b"X-Other: block\r\n\r\n"
    space = b" "
    if odd and rnd.random() < 0.05:
        space = rnd.choice([b"  ", b"\t", b"\x0b", b"\x0c", b" \t"])  # forms nats-py also reads
    reply_part = reply + space if reply else b""
    if headers or (odd and form < 0.65):  # HMSG, some with an empty header block
        header_size = len(headers)
        if odd and rnd.random() < 0.02:
            header_size = len(headers) + len(payload) + 3  # larger than the message
        line = b"HMSG " + subject + space + b"%d" % sid + space + reply_part
        line += b"%d %d\r\n" % (header_size, len(headers) + len(payload))
        return line + headers + payload + b"\r\n"
    line = b"MSG " + subject + space + b"%d" % sid + space + reply_part + b"%d\r\n" % len(payload)
    return line + payload + b"\r\n"


async def _read(parser: Parser, recorder: Recorder, chunk: bytes) -> list[Any]:
    """What one read hands on: the events, and the exception's type if it raised."""
    before = len(recorder.events)
    try:
        await parser.parse(chunk)
    except Exception as exc:  # noqa: BLE001 - compared with nats-py's
        return [*recorder.events[before:], type(exc)]
    return recorder.events[before:]


@pytest.mark.parametrize("seed", range(60))
async def test_the_same_events_as_nats_py_whatever_the_reads(seed: int) -> None:
    rnd = random.Random(seed)
    stream = b"".join(_command(rnd) for _ in range(rnd.randint(1, 120)))
    cuts = sorted(rnd.sample(range(1, len(stream)), min(len(stream) - 1, rnd.randint(0, 60))))
    if seed % 6 == 0 and len(stream) < 20_000:
        cuts = list(range(1, len(stream)))  # a byte at a time
    reference, lean = Recorder(raw=False), Recorder(raw=True)
    nats_py, ours = Parser(reference), LeanParser(lean)
    start = 0
    for cut in [*cuts, len(stream)]:
        chunk = stream[start:cut]
        start = cut
        expected = await _read(nats_py, reference, chunk)
        assert await _read(ours, lean, chunk) == expected  # read by read, not only in the end
        if expected and isinstance(expected[-1], type):
            break  # a protocol error: nats-py's client drops the connection here
        if rnd.random() < 0.03:  # a reconnect resets both; an empty read changes nothing
            nats_py.reset()
            ours.reset()
        elif rnd.random() < 0.05:
            assert await _read(ours, lean, b"") == await _read(nats_py, reference, b"")
    assert lean.events == reference.events
    for event in lean.events:
        if event[0] == "msg":  # what callbacks get is bytes, as from nats-py
            assert all(type(part) is bytes for part in event[2:5])
            assert event[5] is None or type(event[5]) is bytes


async def _feed(parser: Parser, stream: bytes, cuts: list[int]) -> None:
    start = 0
    for cut in [*cuts, len(stream)]:
        await parser.parse(stream[start:cut])
        start = cut


async def test_messages_in_whole_reads_never_reach_nats_py_s_parser(monkeypatch: Any) -> None:
    rnd = random.Random(5)
    stream = b""
    messages = 0
    while len(stream) < 50_000:
        command = _command(rnd, odd=False)
        line = command.split(b"\r\n")[0]
        if line.startswith((b"MSG ", b"HMSG ")) and b"\t" not in line and b"  " not in line:
            stream += command
            messages += 1
    calls = []

    async def generic(self: Parser, data: bytes = b"") -> None:
        calls.append(data)

    monkeypatch.setattr(Parser, "parse", generic)
    recorder = Recorder(raw=True)
    parser = LeanParser(recorder)
    # Cut mid-command as socket reads are: the cut-off part waits for the next read.
    await _feed(parser, stream, [17_001, 33_333])
    assert calls == [] and parser.buf == bytearray()
    assert len(recorder.events) == messages


async def test_a_malformed_command_is_nats_py_s_protocol_error() -> None:
    for bad in (b"MSG a 1 x\r\nabc\r\n", b"BOGUS\r\n", b"MSG a 1 3\r\nabc\r\nPONG x\r\n"):
        with pytest.raises(ProtocolError):
            await LeanParser(Recorder(raw=True)).parse(bad)


async def test_a_large_payload_arriving_in_many_reads_is_parsed_once() -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB
    stream = b"MSG _INBOX.x.1 %d %d\r\n" % (RAW_SID, len(payload)) + payload + b"\r\nPONG\r\n"
    recorder = Recorder(raw=True)
    parser = LeanParser(recorder)
    copies = []

    class CountingBuffer(bytearray):  # how often the kept bytes are copied out to be parsed
        def __bytes__(self) -> bytes:
            copies.append(len(self))
            return bytes(memoryview(self))

    parser.buf = CountingBuffer()
    chunks = [stream[i : i + 16384] for i in range(0, len(stream), 16384)]
    for chunk in chunks[:-1]:
        await parser.parse(chunk)
        assert recorder.events == []
    assert len(parser.buf) == len(stream) - len(chunks[-1])
    await parser.parse(chunks[-1])
    assert recorder.events == [("msg", RAW_SID, b"_INBOX.x.1", b"", payload, None), ("pong",)]
    assert copies == [len(stream)]  # once, when the whole command is there


async def test_a_reset_while_a_message_is_handled_drops_the_rest_of_the_read() -> None:
    """As in nats-py: a reconnect (reset) from inside a message's handling ends that read."""
    results = []
    for parser_class in (Parser, LeanParser):
        recorder = Recorder(raw=False)
        parser = parser_class(recorder)
        handle = recorder._process_msg

        async def resetting(  # type: ignore[no-untyped-def]
            sid, subject, reply, payload, headers, handle=handle, parser=parser
        ):
            await handle(sid, subject, reply, payload, headers)
            if payload == b"boom":
                parser.reset()

        recorder._process_msg = resetting  # type: ignore[method-assign]
        await parser.parse(b"MSG a 1 4\r\nboom\r\nMSG a 1 3\r\nold\r\nMSG a 1 10\r\nold-tail")
        await parser.parse(b"MSG a 1 3\r\nnew\r\n")
        results.append([event[4] for event in recorder.events])
    assert results[0] == results[1] == [b"boom", b"new"]
