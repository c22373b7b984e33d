"""How a consumer's filter subjects meet the subject prefixes of an auth file's stream rules.

A consumer delivers the messages whose subjects match one of its filters (``*`` one token,
``>`` one or more, last); a stream rule covers the subjects that start with its prefix (plain
text, which may end inside a token: ``orders.eu`` covers ``orders.europe.x``). Whether a token
may consume from a consumer (app.auth.access.check_consumer) comes down to two questions about
one filter and such prefixes, answered here without enumerating subjects:

- :func:`reaches`: does some subject the filter matches start with the prefix?
- :func:`confined`: does every subject the filter matches (of those that start with a
  shorter prefix) start with the prefix?
"""

from __future__ import annotations


def reaches(filter_subject: str, prefix: str) -> bool:
    """Whether some subject matching ``filter_subject`` starts with ``prefix``."""
    tokens = filter_subject.split(".")
    parts = prefix.split(".")
    whole, partial = parts[:-1], parts[-1]  # the prefix's complete tokens, then the rest
    for i, part in enumerate(whole):
        if not part or i >= len(tokens):
            return False
        token = tokens[i]
        if token == ">":
            return True  # one or more tokens of any text: the rest of the prefix fits
        if token != "*" and token != part:
            return False
    if len(whole) >= len(tokens):
        return False  # the prefix goes on past the filter's last token (it has a '.' more)
    token = tokens[len(whole)]
    return token in ("*", ">") or token.startswith(partial)


def head(filter_subject: str, prefix: str = "") -> str:
    """The text every subject that matches ``filter_subject`` and starts with ``prefix``
    starts with (``prefix`` at least; meaningful when :func:`reaches` says some does): the
    prefix, then the filter's literal tokens up to its next wildcard."""
    tokens = filter_subject.split(".")
    parts = prefix.split(".")
    position = len(parts) - 1  # the filter token the prefix's last (partial) part falls in
    if any(token == ">" for token in tokens[:position]) or position >= len(tokens):
        return prefix
    if tokens[position] in ("*", ">"):
        return prefix
    known = ".".join([*parts[:-1], tokens[position]])
    for token in tokens[position + 1 :]:
        if token in ("*", ">"):
            return known + "."
        known += "." + token
    return known


def confined(filter_subject: str, prefix: str, within: str = "") -> bool:
    """Whether every subject that matches ``filter_subject`` and starts with ``within``
    starts with ``prefix`` too (sound: when it says so, it is so)."""
    return head(filter_subject, within).startswith(prefix)
