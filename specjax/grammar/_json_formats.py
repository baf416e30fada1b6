"""JSON Schema `format` values as regexes over the decoded string (all ASCII, none needs escaping).

Each regex generates a subset of its RFC grammar that also passes the checks of the `jsonschema`
package's FormatChecker (Python's `date.fromisoformat` rejects year 0000, so it is excluded).
Narrowings are listed in docs/grammar-json-schema.md.
"""

from __future__ import annotations

_YEAR = "(?:000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})"
# Gregorian leap years (divisible by 4, centuries only when divisible by 400); 0000 is not matched.
_LEAP_YEAR = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_MONTH_DAY = ("(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
              "|02-(?:0[1-9]|1[0-9]|2[0-8]))")
DATE = f"(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
# RFC 3339 full-time; the leap second :60 and lower-case z are not generated.
_HOUR, _MINUTE = "(?:[01][0-9]|2[0-3])", "[0-5][0-9]"
TIME = rf"{_HOUR}:{_MINUTE}:{_MINUTE}(?:\.[0-9]+)?(?:Z|[+\-]{_HOUR}:{_MINUTE})"
DATE_TIME = f"{DATE}T{TIME}"
UUID = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"

# RFC 5322 dot-atom local part @ RFC 1123 host name (labels of 1-63 letters, digits, inner hyphens).
_ATEXT = r"[A-Za-z0-9!#$%&'*+\/=?\^_`{|}~\-]"
_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9\\-]{0,61}[A-Za-z0-9])?"
HOSTNAME = rf"{_LABEL}(?:\.{_LABEL})*"
EMAIL = rf"{_ATEXT}+(?:\.{_ATEXT}+)*@{HOSTNAME}"

_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9][0-9]|[0-9])"
IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"

# RFC 3986 URI = scheme ":" hier-part ["?" query] ["#" fragment]; hosts are reg-names (IPv4
# addresses are reg-names syntactically); IP-literals ([v6]) are not generated.
_PCT = "%[0-9A-Fa-f]{2}"
_PCHAR = rf"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@]|{_PCT})"
_USERINFO = rf"(?:[A-Za-z0-9\-._~!$&'()*+,;=:]|{_PCT})*@"
_REG_NAME = rf"(?:[A-Za-z0-9\-._~!$&'()*+,;=]|{_PCT})*"
_AUTHORITY = f"(?:{_USERINFO})?{_REG_NAME}(?::[0-9]*)?"
_HIER = (rf"(?:\/\/{_AUTHORITY}(?:\/{_PCHAR}*)*|\/(?:{_PCHAR}+(?:\/{_PCHAR}*)*)?"
         rf"|{_PCHAR}+(?:\/{_PCHAR}*)*)?")
_TAIL = rf"(?:\?(?:{_PCHAR}|[\/?])*)?(?:#(?:{_PCHAR}|[\/?])*)?"
URI = rf"[A-Za-z][A-Za-z0-9+\-.]*:{_HIER}{_TAIL}"
# RFC 3986 relative-ref: "//" authority path, an absolute path, a first segment without ":", or nothing.
_SEGMENT_NC = rf"(?:[A-Za-z0-9\-._~!$&'()*+,;=@]|{_PCT})"
_RELATIVE = rf"(?:\/\/{_AUTHORITY}(?:\/{_PCHAR}*)*|\/(?:{_PCHAR}+(?:\/{_PCHAR}*)*)?|{_SEGMENT_NC}+(?:\/{_PCHAR}*)*)?"
URI_REFERENCE = rf"(?:{URI}|{_RELATIVE}{_TAIL})"

# RFC 4291 text forms: eight groups, or k groups, "::" (one or more zero groups), at most 7 - k groups. Embedded
# IPv4 tails and zone ids are not generated.
_H16 = "[0-9a-fA-F]{1,4}"
_COMPRESSED = [(f"(?:{_H16}:){{{k - 1}}}{_H16}" if k else "") + "::" +
               (f"(?:{_H16}(?::{_H16}){{0,{6 - k}}})?" if k < 7 else "") for k in range(8)]
IPV6 = "(?:" + "|".join([f"(?:{_H16}:){{7}}{_H16}", *_COMPRESSED]) + ")"

FORMATS = {
    "date-time": DATE_TIME,
    "date": DATE,
    "time": TIME,
    "email": EMAIL,
    "uuid": UUID,
    "uri": URI,
    "uri-reference": URI_REFERENCE,
    "ipv6": IPV6,
    "ipv4": IPV4,
    "hostname": HOSTNAME,
}
# Formats some draft (4 to 2020-12) defines, so that a validator may check them. Any other name ("color",
# "byte", "int64", "semver", ...) is an annotation no validator enforces: ignored, which is exact.
SPEC_FORMATS = frozenset({
    "date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname", "ipv4", "ipv6",
    "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template", "json-pointer", "relative-json-pointer",
    "regex",
})
