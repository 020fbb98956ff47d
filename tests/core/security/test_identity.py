"""Principals and Kafka's `ssl.principal.mapping.rules`, checked against what Kafka's own
SslPrincipalMapper gives for the same rules and subjects."""

from __future__ import annotations

import pytest

from keyshard.core.security.identity import (
    ANONYMOUS,
    IdentityConfigError,
    Principal,
    PrincipalMapper,
    distinguished_name,
    parse_principal,
    subject_of,
)

SUBJECT = (
    (("countryName", "DE"),),
    (("organizationName", "Example Corp"),),
    (("organizationalUnitName", "team-a"),),
    (("commonName", "alice"),),
)


def test_a_principal_reads_and_shows_as_kafka_writes_it() -> None:
    assert parse_principal("User:alice") == Principal("User", "alice")
    assert str(parse_principal(" User:CN=a,O=b ")) == "User:CN=a,O=b"
    assert str(ANONYMOUS) == "User:ANONYMOUS"
    for bad in ("alice", "User:", ":alice", ""):
        with pytest.raises(IdentityConfigError, match="<type>:<name>"):
            parse_principal(bad, setting="--auth-token-principal")


def test_the_subject_is_rfc2253_most_specific_first() -> None:
    assert distinguished_name(SUBJECT) == "CN=alice,OU=team-a,O=Example Corp,C=DE"
    escaped = ((("commonName", 'a,b+c"d\\e<f>g;h'),), (("organizationName", " #x "),))
    assert distinguished_name(escaped) == 'O=\\ #x\\ ,CN=a\\,b\\+c\\"d\\\\e\\<f\\>g\\;h'
    multi = ((("commonName", "a"), ("userId", "7")),)
    assert distinguished_name(multi) == "CN=a+UID=7"
    assert distinguished_name(((("emailAddress", "a@x"),),)) == "emailAddress=a@x"
    assert subject_of({"subject": SUBJECT}) == SUBJECT
    assert subject_of(None) is None and subject_of({}) is None


@pytest.mark.parametrize(
    ("rules", "dn", "name"),
    [
        ("DEFAULT", "CN=alice,OU=team-a,O=Example", "CN=alice,OU=team-a,O=Example"),
        ("RULE:^CN=(.*?),OU=(.*?),O=.*$/$1@$2/", "CN=alice,OU=team-a,O=Example", "alice@team-a"),
        ("RULE:^CN=(.*?),OU=(.*?),O=.*$/$1/U", "CN=alice,OU=team-a,O=Example", "ALICE"),
        ("RULE:^CN=(.*?),OU=(.*?),O=.*$/$2/L", "CN=x,OU=Team-A,O=E", "team-a"),
        # The first rule that matches wins; DEFAULT after it catches the rest.
        ("RULE:^CN=(.*?),OU=svc$/$1/, DEFAULT", "CN=bot,OU=svc", "bot"),
        ("RULE:^CN=(.*?),OU=svc$/$1/, DEFAULT", "CN=bob,OU=people", "CN=bob,OU=people"),
        # A group the pattern lacks stays literal; $10 with one group is $1 then "0".
        ("RULE:^CN=(.*)$/$1-$2/", "CN=a", "a-$2"),
        ("RULE:^CN=(.*)$/$10/", "CN=a", "a0"),
        # An escaped slash in the pattern and the replacement.
        (r"RULE:^CN=(.*)\/x$/$1\/y/", "CN=a/x", "a/y"),
        # Java's replaceAll after a whole match: `.*` also matches the empty end.
        ("RULE:.*/x/", "CN=a", "xx"),
    ],
)
def test_mapping_rules_name_the_user_as_kafka_does(rules: str, dn: str, name: str) -> None:
    assert PrincipalMapper(rules).principal(dn) == Principal("User", name)


@pytest.mark.parametrize(
    ("rules", "complaint"),
    [
        ("", "none given"),
        ("RULE:^CN=(.*)$/$1", "a '/' is missing"),
        ("RULE:^CN=(.*$/$1/", "no regular expression"),
        ("RULE:a/b/X", "unexpected 'X'"),
        ("DEFAULT; RULE:a/b/", "unexpected ';"),
        ("ANYTHING", "is not a rule"),
    ],
)
def test_malformed_rules_are_refused_with_what_is_wrong(rules: str, complaint: str) -> None:
    with pytest.raises(IdentityConfigError, match=complaint):
        PrincipalMapper(rules)


def test_a_subject_no_rule_matches_is_an_error_naming_it() -> None:
    mapper = PrincipalMapper("RULE:^CN=(.*?),OU=svc$/$1/")
    with pytest.raises(IdentityConfigError, match=r"no principal mapping rule applies.*CN=bob"):
        mapper.principal("CN=bob,OU=people")
    with pytest.raises(IdentityConfigError, match="empty name"):
        PrincipalMapper("RULE:^CN=(.*)$/$1/").principal("CN=")
