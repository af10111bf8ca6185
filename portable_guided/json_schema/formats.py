"""What ``format`` means here: one table entry per standard format of JSON Schema 2020-12.

Each entry names the language we compile for the format, as an anchored regex in the subset
of ECMAScript that xgrammar and llguidance both read alike (plain groups, character classes,
counted repeats up to 64; no lookaround, no backreference, no ``\\d``): either the format's
exact language or a documented sound subset of it (every string it accepts is a valid value
of the format under its RFC and under ``jsonschema``'s strict format checker with its optional
packages). The JSON lowering (:mod:`.lowering`) puts the entry's ``pattern`` in
place of ``format``, so both engines enforce this language rather than their own format code
(which accepts leap seconds anywhere, February 31, labels over 63 characters, invalid
punycode). A subset is taken only where the schema is not negated (``not``, ``if``, a
``oneOf`` branch): there the negation of a subset would be a superset, and the format is
refused instead (:mod:`.refusals`), as is a format an entry refuses outright.

Imports no grammar engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["ENGINES", "FORMATS", "Format", "format_table_markdown", "pattern_for"]

#: The engines a :class:`Format` entry speaks of (``auto`` uses one of them).
ENGINES = ("xgrammar", "llguidance")


@dataclass(frozen=True)
class Format:
    """One standard format: the regex we compile for it and how it relates to the format.

    ``pattern``: the anchored regex (``^...$``) we compile in place of ``format``, or
    ``None`` where no engine enforces the format (refused everywhere). ``exact``: the pattern
    is the format's whole language (``left_out`` then says ``""``); otherwise ``left_out``
    says what valid values the subset leaves out. ``refused``: engine name to the reason it
    refuses the format (its pattern cannot be made sound there). ``length``: the one length
    every value has, if any (``minLength``/``maxLength`` beside it are then decided here).
    ``reference``: the RFC that defines the format.
    """

    name: str
    pattern: str | None
    exact: bool
    left_out: str
    reference: str
    refused: Mapping[str, str]
    length: int | None = None

    def status(self, engine: str) -> str:
        """``"exact"``, ``"subset"`` or ``"refused"`` on ``engine``."""
        if self.pattern is None or engine in self.refused:
            return "refused"
        return "exact" if self.exact else "subset"


# -- building blocks (plain groups, classes and counts: what both engines read alike) --
_ALNUM = "[a-zA-Z0-9]"
_LDH = "[a-zA-Z0-9-]"
_HEX = "[0-9a-fA-F]"


def _label(most: int) -> str:
    """An LDH label of 1 to ``most`` (at least 5) characters, starting and ending with a
    letter or digit, without ``--`` at positions 3-4 (RFC 5891 4.2.3.1 reserves those for
    A-labels, which must then be valid punycode: ``xn--`` labels are left out)."""
    return (f"{_ALNUM}({_LDH}?{_ALNUM}|{_LDH}{_LDH}{_ALNUM}|"
            f"{_LDH}({_ALNUM}{_LDH}|-{_ALNUM}){_LDH}{{0,{most - 5}}}{_ALNUM})?")


#: The longest label of a name we compile. Every character a regex can count is a state that
#: xgrammar compiles against the whole vocabulary (about 5 ms each for a letter class), so
#: a name is bounded by its labels: names of up to 253 characters of labels up to 63 (RFC
#: 1123) cost 1.5-5 s to compile there; up to 6 labels of 24, 0.3-1.2 s.
_LABEL_MOST = 24


def _host(labels: int) -> str:
    """Up to ``labels`` dot-separated labels of at most :data:`_LABEL_MOST` characters (so
    at most ``25 * labels - 1`` in all, within RFC 1123's 253 and 63 per label)."""
    return f"({_label(_LABEL_MOST)}(\\.{_label(_LABEL_MOST)}){{0,{labels - 1}}})"


_YEAR = "([0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"  # 0001-9999
_LEAP_YEAR = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)"
_DATE = (f"({_YEAR}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
         f"|02-(0[1-9]|1[0-9]|2[0-8]))|{_LEAP_YEAR}-02-29)")
_TIME = ("([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]+)?"
         "([zZ]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])")
_DUR_TIME = "T([0-9]+H([0-9]+M([0-9]+S)?)?|[0-9]+M([0-9]+S)?|[0-9]+S)"
_DUR_DATE = "([0-9]+D|[0-9]+M([0-9]+D)?|[0-9]+Y([0-9]+M([0-9]+D)?)?)"
_DURATION = f"P({_DUR_DATE}({_DUR_TIME})?|{_DUR_TIME}|[0-9]+W)"
_OCTET = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4 = f"{_OCTET}\\.{_OCTET}\\.{_OCTET}\\.{_OCTET}"


def _ipv6() -> str:
    """RFC 4291 2.2 text forms: eight groups, or ``::`` standing for at least one group,
    with an IPv4 address as the last two groups where they are written."""
    h = f"{_HEX}{{1,4}}"
    forms = [f"({h}:){{7}}{h}", f"({h}:){{6}}{_IPV4}"]
    for before in range(8):  # groups written before `::`
        head = "" if before == 0 else (f"({h}:){{{before - 1}}}{h}" if before > 1 else h)
        room = 7 - before  # groups `::` may leave to be written after it
        tails = []
        if room >= 1:
            tails.append(f"({h}:){{0,{room - 1}}}{h}" if room > 1 else h)
        if room >= 2:
            tails.append(f"({h}:){{0,{room - 2}}}{_IPV4}" if room > 2 else _IPV4)
        tail = f"({'|'.join(tails)})?" if tails else ""
        forms.append(f"{head}::{tail}")
    return "(" + "|".join(forms) + ")"


_ATEXT = "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]"
# A dot-atom local part of up to 4 atoms (63 characters at most: RFC 5321 allows 64 octets)
# at a hostname (254 in all). "first.middle.last" needs 3 atoms; counted characters are
# what xgrammar pays for, so later atoms are shorter.
_EMAIL = f"{_ATEXT}{{1,24}}(\\.{_ATEXT}{{1,12}}){{0,3}}@{_host(4)}"
# RFC 3986 (ASCII; an IRI's ucschar left out).
_UNRESERVED_SUB = "[a-zA-Z0-9._~!$&'()*+,;=-]"
_PCT = f"%{_HEX}{_HEX}"
_PCHAR = f"([a-zA-Z0-9._~!$&'()*+,;=:@-]|{_PCT})"
_SEGMENT = f"{_PCHAR}*"
_SEGMENT_NZ_NC = f"([a-zA-Z0-9._~!$&'()*+,;=@-]|{_PCT})+"
# No IP literal (`[::1]`): with the IPv6 forms, xgrammar compiles a `uri` 5 times slower.
_AUTHORITY = (f"(([a-zA-Z0-9._~!$&'()*+,;=:-]|{_PCT})*@)?({_UNRESERVED_SUB}|{_PCT})*"
              "(:[0-9]*)?")
_PATH_ABEMPTY = f"(/{_SEGMENT})*"
_PATH_ABSOLUTE = f"/({_PCHAR}+{_PATH_ABEMPTY})?"
_QUERY_FRAGMENT = f"(\\?([a-zA-Z0-9._~!$&'()*+,;=:@/?-]|{_PCT})*)?(#([a-zA-Z0-9._~!$&'()*+,;=:@/?-]|{_PCT})*)?"
_URI = (f"[a-zA-Z][a-zA-Z0-9+.-]*:(//{_AUTHORITY}{_PATH_ABEMPTY}|{_PATH_ABSOLUTE}"
        f"|{_PCHAR}+{_PATH_ABEMPTY})?{_QUERY_FRAGMENT}")
_RELATIVE_REF = (f"(//{_AUTHORITY}{_PATH_ABEMPTY}|{_PATH_ABSOLUTE}"
                 f"|{_SEGMENT_NZ_NC}{_PATH_ABEMPTY})?{_QUERY_FRAGMENT}")
_URI_REFERENCE = f"({_URI}|{_RELATIVE_REF})"
# RFC 6570: literals (ASCII, no pct-encoded), expressions of levels 1-4 with the operators
# the levels define (op-reserve `= , ! @ |` is reserved for future use).
_UT_LITERAL = "[a-zA-Z0-9!#$&()*+,./:;=?@_~-]"
_UT_VARNAME = "[a-zA-Z0-9_](\\.?[a-zA-Z0-9_])*"
_UT_VARSPEC = f"{_UT_VARNAME}(:[1-9][0-9]{{0,2}}|\\*)?"
_URI_TEMPLATE = f"({_UT_LITERAL}|\\{{[+#./;?&]?{_UT_VARSPEC}(,{_UT_VARSPEC})*\\}})*"
_POINTER = "(/([^/~]|~[01])*)*"
# A regex without groups, classes or escapes: literal characters and `.` with a quantifier
# each, optionally anchored (every such string compiles under ECMA-262 and Python).
_REGEX = "\\^?(([a-zA-Z0-9 _,:;=!@#%&'/<>~-]|\\.)[*+?]?)*\\$?"


def _entry(name: str, body: str | None, reference: str, left_out: str = "", *,
           refused: Mapping[str, str] | None = None, length: int | None = None) -> Format:
    pattern = None if body is None else f"^{body}$"
    return Format(name, pattern, exact=not left_out, left_out=left_out,
                  reference=reference, refused=dict(refused or {}), length=length)


_NO_LEAP_SECOND = "leap seconds (`:60`)"
_ASCII_HOST = ("labels with `--` at positions 3-4 (so every `xn--` A-label), labels of more "
               "than 24 characters, names of more than 6 labels, a trailing dot")
_ASCII_IRI = "non-ASCII characters, IP literals (`[...]`) in the authority"

#: Every standard format of JSON Schema 2020-12, by name.
FORMATS: dict[str, Format] = {f.name: f for f in (
    _entry("date-time", f"{_DATE}[tT]{_TIME}", "RFC 3339 5.6",
           f"{_NO_LEAP_SECOND}, year 0000"),
    _entry("date", _DATE, "RFC 3339 5.6", "year 0000", length=10),
    _entry("time", _TIME, "RFC 3339 5.6", _NO_LEAP_SECOND),
    _entry("duration", _DURATION, "RFC 3339 appendix A"),
    _entry("email", _EMAIL, "RFC 5321 4.1.2", "quoted local parts, address literals, "
           "local parts of more than 4 atoms, a first atom of more than 24 characters or a "
           "later one of more than 12, domains of more than 4 labels; labels as in hostname"),
    _entry("idn-email", _EMAIL, "RFC 6531", "non-ASCII characters; the rest as email"),
    _entry("hostname", _host(6), "RFC 1123 2.1", _ASCII_HOST),
    _entry("idn-hostname", _host(6), "RFC 5890 2.3.2.3", f"U-labels; {_ASCII_HOST}"),
    _entry("ipv4", _IPV4, "RFC 2673 3.2"),
    _entry("ipv6", _ipv6(), "RFC 4291 2.2"),
    _entry("uri", _URI, "RFC 3986", "IP literals (`[...]`) in the authority"),
    _entry("uri-reference", _URI_REFERENCE, "RFC 3986",
           "IP literals (`[...]`) in the authority"),
    _entry("iri", _URI, "RFC 3987", _ASCII_IRI),
    _entry("iri-reference", _URI_REFERENCE, "RFC 3987", _ASCII_IRI),
    _entry("uuid", f"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}", "RFC 4122",
           length=36),
    _entry("uri-template", _URI_TEMPLATE, "RFC 6570",
           "non-ASCII and pct-encoded literals and variable names, `[`, `]`, prefixes of "
           "1000 or more (`{x:1000}`: the `uri-template` package refuses them)"),
    _entry("json-pointer", _POINTER, "RFC 6901"),
    # jsonschema's checker refuses a digit after a 0 anywhere in the integer (`100`).
    _entry("relative-json-pointer", f"(0|[1-9]+0?)(#|{_POINTER})",
           "draft-bhutton-relative-json-pointer-00", "index manipulation (`0+1`, `1-2/a`), "
           "integers with a 0 before another digit (`100`: `jsonschema` refuses them)"),
    _entry("regex", _REGEX, "ECMA-262",
           "groups, classes, escapes, counted repeats, alternation"),
)}


def pattern_for(name: str) -> str | None:
    """The regex compiled in place of ``format: name`` (``None``: not a standard format, or
    refused on every engine)."""
    entry = FORMATS.get(name)
    return None if entry is None else entry.pattern


def format_table_markdown() -> str:
    """The table of :data:`FORMATS` as markdown: per format and engine, exact, subset (and
    what it leaves out) or refused (and why); pasted into docs/json_schema.md."""
    rows = ["| format | " + " | ".join(ENGINES) + " | left out of the subset |",
            "|---|" + "---|" * len(ENGINES) + "---|"]
    for f in FORMATS.values():
        cells = []
        for engine in ENGINES:
            status = f.status(engine)
            why = f.refused.get(engine)
            cells.append(f"refused: {why}" if why else status)
        rows.append(f"| `{f.name}` | " + " | ".join(cells) + f" | {f.left_out or '-'} |")
    return "\n".join(rows) + "\n"
