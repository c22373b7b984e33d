"""Reading the NATS protocol: nats-py's parser, with a fast path for messages.

nats-py's parser tries two regular expressions on every ``MSG``/``HMSG`` control line, keeps its
arguments in a dict and hands each message to a coroutine. Replies to the gateway's requests
are most of what a connection reads, so :class:`LeanParser` reads complete ``MSG`` and ``HMSG``
commands itself: it splits the control line on single spaces, slices the header block and
payload out of the chunk read, and gives a message of a raw subscription
(:meth:`app.nats.replies.LeanClient.raw_subscribe`) to its plain callback. Anything else (PING,
PONG, INFO, +OK, -ERR, a control line in another form, a command nats-py is already in the
middle of) goes to nats-py's parser, as do messages of other subscriptions once read
(``_process_msg``): what nats-py does with them is unchanged. A command cut off at the end of a
read is kept, unparsed, and read again with the next chunk (a large payload only once it
is all there).

nats-py's own pattern for ``HMSG`` lets the whitespace between its two sizes run past the end
of the line, so when a header block starts with digits and a line break (never the case for a
block starting ``NATS/1.0``, as the server's do) nats-py may frame the command differently
depending on where a read ends. The fast path reads such a line as a single line; after a hand
off, nats-py's reading stands.
"""

from __future__ import annotations

from typing import Any

from app.compat import AWAITING_CONTROL_LINE, MAX_CONTROL_LINE_SIZE, NatsParser

_CRLF = b"\r\n"
_MAX_DIGITS = 18  # longer numbers (past int()'s limits too) are left to nats-py's parser


class LeanParser(NatsParser):
    """nats-py's ``Parser``, reading ``MSG``/``HMSG`` commands on a fast path."""

    _wanted = 0  # bytes the command kept in ``buf`` needs before it is worth parsing again

    def reset(self) -> None:
        super().reset()
        self._wanted = 0

    async def parse(self, data: bytes = b"") -> None:
        # A control line in the fast path's form is made of single spaces and no other
        # whitespace (nats-py's patterns also take tabs and runs of spaces: such a line, as
        # any it does not know, is left to nats-py's parser).
        if self.state != AWAITING_CONTROL_LINE:
            # nats-py's parser has read a control line and waits for the payload: it finishes.
            await super().parse(data)
            return
        buf = self.buf
        if buf:  # unparsed bytes: a command cut off at the end of the last read
            if not self._wanted and len(buf) >= MAX_CONTROL_LINE_SIZE:
                # No line nats-py's parser can end (it waits without copying): it goes on.
                await super().parse(data)
                return
            buf.extend(data)
            if len(buf) < self._wanted:
                return  # a large payload still arriving: not copied again on every read
            data = bytes(buf)
            buf.clear()
        self._wanted = 0
        nc = self.nc
        handlers: dict[int, Any] = nc._raw_handlers
        end = len(data)
        pos = 0
        while pos < end:
            eol = data.find(_CRLF, pos)
            if eol < 0:
                buf.extend(data[pos:])  # no whole line yet (nats-py would wait as well)
                return
            line = data[pos:eol]
            args = line.split(b" ")
            op = args[0]
            count = len(args)
            if op == b"HMSG" and (count == 5 or count == 6):
                header_size, total = args[-2], args[-1]
            elif op == b"MSG" and (count == 4 or count == 5):
                header_size, total = b"0", args[-1]
            else:
                break
            sid = args[2]
            if (
                not (sid.isdigit() and header_size.isdigit() and total.isdigit())
                or len(sid) > _MAX_DIGITS
                or len(header_size) > _MAX_DIGITS
                or len(total) > _MAX_DIGITS
                or b"" in args  # two spaces in a row
                or 9 in line
                or 10 in line
                or 11 in line
                or 12 in line
                or 13 in line
            ):
                break
            start = eol + 2
            stop = start + int(total)
            if stop + 2 > end:
                buf.extend(data[pos:])  # the payload is not all here yet
                self._wanted = stop + 2 - pos
                return
            split = start + int(header_size)
            if split > stop:
                break  # a header block longer than the message: nats-py's parser decides
            headers = data[start:split] if split > start else None
            payload = data[split:stop]
            pos = stop + 2
            handler = handlers.get(int(sid))
            if handler is not None:
                handler(args[1], headers, payload)
            else:
                reply = args[3] if count == (6 if op == b"HMSG" else 5) else b""
                await nc._process_msg(int(sid), args[1], reply, payload, headers)
                if self.buf is not buf:
                    return  # reset while the message was handled (a reconnect): drop the rest
        if pos < end:
            await super().parse(data[pos:])
