"""Per-subject sequence floors: the highest sequence of each subject's last message this
process has served or written (a KV key's revision, a counter's value).

Direct Get may be answered by any replica of a stream (or a mirror), and nats-server lets a
follower answer once it holds 90% of the stream's log: a server restarted behind the others
answers with what it has while it catches up, which can be many sequences behind what the
gateway already answered or wrote. A latest-value read older than its subject's floor is read
again from the stream leader (:meth:`app.kv.service.KVService.get`,
:meth:`app.counters.service.CounterService.get`), so that reads through one gateway process
never go backwards for a key or a counter, and show the process's own writes.

The floors are bounded: past :data:`MAX_KEYS` keys, the one whose floor was set or raised
longest ago is dropped, and its next read has no floor to be checked against (it sets one
again). Reads do not reorder keys, so that a read whose revision is the floor costs one dict
lookup and a comparison.
"""

from __future__ import annotations

from collections import OrderedDict

MAX_KEYS = 100_000


class RevisionFloors:
    """Subject -> the highest sequence (revision) served or written: a KV key's subject
    (``$KV.<bucket>.<key>``), or a counter's as :func:`app.counters.service.floor_key` names
    it (its stream too: mirrors keep the same subjects at other sequences).

    :attr:`revisions` is read directly on the hot path; it is changed only through the
    methods below, which keep it bounded.
    """

    __slots__ = ("max_keys", "revisions")

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self.max_keys = max_keys
        self.revisions: OrderedDict[str, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self.revisions)

    def advance(self, subject: str, revision: int) -> None:
        """The subject is known to have reached ``revision``: raise its floor to it."""
        revisions = self.revisions
        if revision <= revisions.get(subject, 0):
            return
        revisions[subject] = revision
        revisions.move_to_end(subject)
        if len(revisions) > self.max_keys:
            revisions.popitem(last=False)

    def settle(self, subject: str, checked: int, revision: int) -> None:
        """The stream leader's answer (``revision``, 0 for none) to a read whose floor was
        ``checked``.

        The leader holds every revision ever acknowledged, so an answer older than the floor
        means the subject really went back: its messages were removed by other means than
        the gateway's API (a stream purge, a message's max age, the stream deleted and made
        again).
        The floor becomes the leader's answer, unless a write or a read raised it past
        ``checked`` meanwhile (then that newer floor stands).
        """
        current = self.revisions.get(subject, 0)
        if revision >= current:
            self.advance(subject, revision)
        elif current == checked:
            if revision:
                self.revisions[subject] = revision
            else:
                del self.revisions[subject]
