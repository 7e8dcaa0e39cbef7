"""RocketMQ's SQL92 property filter: parse a subscription's expression once, then decide for each message.

The grammar is RocketMQ's (docs/client-consumers.md, "SQL92 filters"):
  condition  := or
  or         := and ('OR' and)*
  and        := not ('AND' not)*
  not        := 'NOT' not | '(' condition ')' | predicate | TRUE | FALSE
  predicate  := value ( ('=' | '<>' | '>' | '>=' | '<' | '<=') value
                      | 'IS' ['NOT'] 'NULL'
                      | ['NOT'] 'BETWEEN' number 'AND' number
                      | ['NOT'] 'IN' '(' string (',' string)* ')'
                      | ['NOT'] ('CONTAINS' | 'STARTSWITH' | 'ENDSWITH') string )
  value      := property | number | string ('...', '' inside is a quote) | TRUE | FALSE
Keywords are case-insensitive; a property is a name of [a-zA-Z_$][a-zA-Z0-9_.$]*; `TAGS` is the message's tag.

What a message's values are: user properties are strings. `=` and `<>` compare strings, or numbers when
either side is a number literal (a property that is not a number is then unequal); `>`, `>=`, `<`, `<=` and
BETWEEN compare numbers only. A missing property makes its predicate unknown, and unknown follows SQL's
three-valued logic (NOT unknown is unknown); a message is delivered only when the whole condition is TRUE.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rocketraft.protocol.errors import BadRequestError, IllegalFilterExpressionError

EXPRESSION_CHARS_MAX = 4096
NESTING_MAX = 64  # parentheses and NOTs inside each other
IN_VALUES_MAX = 1024
TAGS = "TAGS"  # the pseudo-property that names the message's tag

Value = str | int | float | bool | None
Truth = bool | None  # None = unknown
Evaluate = Callable[[Mapping[str, str], str], Truth]

_SPACE = re.compile(r"\s*")
_TOKEN = re.compile(r"""
    (?:
      (?P<string>'(?:[^']|'')*')
    | (?P<number>-?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)
    | (?P<op><>|>=|<=|=|>|<|\(|\)|,)
    | (?P<word>[a-zA-Z_$][a-zA-Z0-9_.$]*)
    )""", re.VERBOSE)
KEYWORDS = frozenset({"AND", "OR", "NOT", "IS", "NULL", "BETWEEN", "IN", "TRUE", "FALSE", "CONTAINS", "STARTSWITH",
                      "ENDSWITH"})
STRING_TESTS = {"CONTAINS": str.__contains__, "STARTSWITH": str.startswith, "ENDSWITH": str.endswith}


@dataclass(frozen=True)
class Token:
    kind: str  # "string", "number", "op", "word", "keyword", "end"
    text: str
    at: int  # character offset in the expression


@dataclass(frozen=True)
class Condition:
    """A compiled filter: `matches(properties, tag)` is True when the message is to be delivered."""
    expression: str
    evaluate: Evaluate

    def matches(self, properties: Mapping[str, str], tag: str) -> bool:
        return self.evaluate(properties, tag) is True


def error(expression: str, at: int, problem: str) -> BadRequestError:
    near = expression[at:at + 20] or "the end"
    return IllegalFilterExpressionError(
        f"SQL92 filter {expression[:200]!r}: {problem} at character {at + 1} (near {near!r}); "
        "write conditions such as \"TAGS IN ('a', 'b') AND price > 10\"")


def tokenize(expression: str) -> list[Token]:
    tokens, at = [], 0
    while True:
        at = _SPACE.match(expression, at).end()
        if at >= len(expression):
            break
        match = _TOKEN.match(expression, at)
        if match is None:
            raise error(expression, at, "unexpected character")
        kind = match.lastgroup
        text = match.group(kind)
        start = match.start(kind)
        if kind == "word" and text.upper() in KEYWORDS:
            kind, text = "keyword", text.upper()
        tokens.append(Token(kind, text, start))
        at = match.end()
    tokens.append(Token("end", "", len(expression)))
    return tokens


@functools.lru_cache(maxsize=1024)
def compile_condition(expression: str) -> Condition:
    """The expression compiled, or BadRequestError (ILLEGAL_FILTER_EXPRESSION) naming what is wrong and where."""
    if not expression.strip():
        raise IllegalFilterExpressionError("SQL92 filter is empty; write a condition such as \"price > 10\"")
    if len(expression) > EXPRESSION_CHARS_MAX:
        raise IllegalFilterExpressionError(
            f"SQL92 filter of {len(expression)} characters: at most {EXPRESSION_CHARS_MAX}")
    parser = _Parser(expression, tokenize(expression))
    evaluate = parser.condition(0)
    parser.expect_end()
    return Condition(expression, evaluate)


class _Parser:
    def __init__(self, expression: str, tokens: list[Token]):
        self.expression, self.tokens, self.i = expression, tokens, 0

    @property
    def token(self) -> Token:
        return self.tokens[self.i]

    def take(self, kind: str, text: str | None = None) -> Token | None:
        token = self.token
        if token.kind == kind and (text is None or token.text == text):
            self.i += 1
            return token
        return None

    def fail(self, problem: str) -> BadRequestError:
        return error(self.expression, self.token.at, problem)

    def expect_end(self) -> None:
        if self.token.kind != "end":
            raise self.fail(f"unexpected {self.token.text!r}")

    def condition(self, depth: int) -> Evaluate:
        if depth > NESTING_MAX:
            raise self.fail(f"more than {NESTING_MAX} nested parentheses or NOTs")
        parts = [self.conjunction(depth)]
        while self.take("keyword", "OR"):
            parts.append(self.conjunction(depth))
        return parts[0] if len(parts) == 1 else _any(parts)

    def conjunction(self, depth: int) -> Evaluate:
        parts = [self.negation(depth)]
        while self.take("keyword", "AND"):
            parts.append(self.negation(depth))
        return parts[0] if len(parts) == 1 else _all(parts)

    def negation(self, depth: int) -> Evaluate:
        if self.take("keyword", "NOT"):
            if depth + 1 > NESTING_MAX:
                raise self.fail(f"more than {NESTING_MAX} nested parentheses or NOTs")
            inner = self.negation(depth + 1)
            return lambda props, tag: None if (v := inner(props, tag)) is None else not v
        if self.take("op", "("):
            inner = self.condition(depth + 1)
            if not self.take("op", ")"):
                raise self.fail("')' expected")
            return inner
        return self.predicate()

    def predicate(self) -> Evaluate:
        start = self.token
        left = self.value()
        if self.take("keyword", "IS"):
            negated = bool(self.take("keyword", "NOT"))
            if not self.take("keyword", "NULL"):
                raise self.fail("NULL expected after IS")
            return lambda props, tag: (left(props, tag) is None) != negated
        negated = bool(self.take("keyword", "NOT"))
        for word, build in (("BETWEEN", self.between), ("IN", self.in_list)):
            if self.take("keyword", word):
                return _maybe_not(build(left), negated)
        for word, test in STRING_TESTS.items():
            if self.take("keyword", word):
                return _maybe_not(_string_test(left, self.string(), test), negated)
        if negated:
            raise self.fail("BETWEEN, IN, CONTAINS, STARTSWITH or ENDSWITH expected after NOT")
        op = self.take("op")
        if op is None or op.text not in _COMPARE:
            if start.kind == "keyword" and start.text in ("TRUE", "FALSE"):
                return lambda props, tag, value=start.text == "TRUE": value
            raise self.fail("a comparison (=, <>, >, >=, <, <=, IS, IN, BETWEEN, ...) expected")
        right_token = self.token
        right = self.value()
        if op.text not in ("=", "<>") and "string" in (start.kind, right_token.kind):
            raise error(self.expression, op.at, f"{op.text} compares numbers; compare strings with = or <>")
        return _compare(left, op.text, right)

    def value(self) -> Callable[[Mapping[str, str], str], Value]:
        token = self.token
        if self.take("string"):
            text = token.text[1:-1].replace("''", "'")
            return lambda props, tag: text
        if self.take("number"):
            number = _number(token.text)
            return lambda props, tag: number
        if self.take("keyword", "TRUE") or self.take("keyword", "FALSE"):
            truth = token.text == "TRUE"
            return lambda props, tag: truth
        if self.take("keyword", "NULL"):
            return lambda props, tag: None
        if self.take("word"):
            name = token.text
            if name == TAGS:
                return lambda props, tag: tag or None
            return lambda props, tag: props.get(name)
        raise self.fail("a property, a number or a 'string' expected")

    def number(self) -> float | int:
        token = self.take("number")
        if token is None:
            raise self.fail("a number expected")
        return _number(token.text)

    def string(self) -> str:
        token = self.take("string")
        if token is None:
            raise self.fail("a 'string' expected")
        return token.text[1:-1].replace("''", "'")

    def between(self, left) -> Evaluate:
        low = self.number()
        if not self.take("keyword", "AND"):
            raise self.fail("AND expected in BETWEEN")
        high = self.number()
        return lambda props, tag: None if (v := _as_number(left(props, tag))) is None else low <= v <= high

    def in_list(self, left) -> Evaluate:
        if not self.take("op", "("):
            raise self.fail("'(' expected after IN")
        values = {self.string()}
        while self.take("op", ","):
            values.add(self.string())
            if len(values) > IN_VALUES_MAX:
                raise self.fail(f"more than {IN_VALUES_MAX} values in IN")
        if not self.take("op", ")"):
            raise self.fail("')' expected after the IN list")
        frozen = frozenset(values)
        return lambda props, tag: None if (v := left(props, tag)) is None else _text(v) in frozen


def _number(text: str) -> int | float:
    return float(text) if any(c in text for c in ".eE") else int(text)


def _as_number(value: Value) -> int | float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return value
    try:
        return _number(value.strip()) if len(value) <= 64 else None
    except ValueError:
        return None


def _text(value: Value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _equal(a: Value, b: Value) -> Truth:
    if a is None or b is None:
        return None
    if isinstance(a, bool) or isinstance(b, bool):
        return _text(a).lower() == _text(b).lower()
    if isinstance(a, (int, float)) or isinstance(b, (int, float)):
        x, y = _as_number(a), _as_number(b)
        return x is not None and y is not None and x == y
    return a == b


def _ordered(test: Callable[[float, float], bool]):
    def compare(a: Value, b: Value) -> Truth:
        if a is None or b is None:
            return None
        x, y = _as_number(a), _as_number(b)
        return x is not None and y is not None and test(x, y)

    return compare


_COMPARE = {
    "=": _equal,
    "<>": lambda a, b: None if (v := _equal(a, b)) is None else not v,
    ">": _ordered(lambda x, y: x > y), ">=": _ordered(lambda x, y: x >= y),
    "<": _ordered(lambda x, y: x < y), "<=": _ordered(lambda x, y: x <= y),
}


def _compare(left, op: str, right) -> Evaluate:
    compare = _COMPARE[op]
    return lambda props, tag: compare(left(props, tag), right(props, tag))


def _string_test(left, operand: str, test) -> Evaluate:
    return lambda props, tag: None if (v := left(props, tag)) is None else test(_text(v), operand)


def _maybe_not(evaluate: Evaluate, negated: bool) -> Evaluate:
    if not negated:
        return evaluate
    return lambda props, tag: None if (v := evaluate(props, tag)) is None else not v


def _all(parts: list[Evaluate]) -> Evaluate:
    return _combine(parts, decisive=False)


def _any(parts: list[Evaluate]) -> Evaluate:
    return _combine(parts, decisive=True)


def _combine(parts: list[Evaluate], decisive: bool) -> Evaluate:
    """SQL's AND (decisive=False: one FALSE decides) and OR (decisive=True: one TRUE decides); otherwise unknown
    if any part is unknown."""
    def evaluate(props, tag) -> Truth:
        unknown = False
        for part in parts:
            v = part(props, tag)
            if v is decisive:
                return decisive
            unknown = unknown or v is None
        return None if unknown else not decisive

    return evaluate
