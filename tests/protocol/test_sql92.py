"""RocketMQ's SQL92 property filter (rocketraft/protocol/sql92.py): what each condition delivers, and every
malformed expression refused by name."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketraft.protocol.errors import BadRequestError
from rocketraft.protocol.sql92 import EXPRESSION_CHARS_MAX, NESTING_MAX, compile_condition
from rocketraft.protocol.wire import Code

PROPS = {"price": "25", "region": "eu-west", "vip": "true", "note": "it's", "ratio": "0.5", "word": "abc"}
TAG = "TagA"

CASES = [
    ("price > 10", True), ("price > 25", False), ("price >= 25", True), ("price < 30 AND price <= 25", True),
    ("price = 25", True), ("price = 25.0", True), ("price <> 25", False), ("ratio < 1", True),
    ("price BETWEEN 20 AND 30", True), ("price NOT BETWEEN 20 AND 30", False), ("price BETWEEN 26 AND 30", False),
    ("region = 'eu-west'", True), ("region <> 'eu-west'", False), ("region = 'EU-WEST'", False),
    ("region IN ('us', 'eu-west')", True), ("region NOT IN ('us', 'eu-west')", False),
    ("note = 'it''s'", True), ("TAGS = 'TagA'", True), ("TAGS IN ('TagB', 'TagC')", False),
    ("region CONTAINS 'west'", True), ("region STARTSWITH 'eu'", True), ("region ENDSWITH 'east'", False),
    ("region NOT CONTAINS 'west'", False), ("vip = TRUE", True), ("vip = FALSE", False),
    ("missing IS NULL", True), ("price IS NOT NULL", True), ("missing IS NOT NULL", False),
    # a missing property makes its predicate unknown: neither it nor its negation delivers
    ("missing = 'x'", False), ("NOT (missing = 'x')", False), ("missing > 1", False), ("missing <> 'x'", False),
    ("missing = 'x' OR price > 10", True), ("missing = 'x' AND price > 10", False),
    ("NOT missing = 'x' OR TRUE", True),
    # a property that is not a number never equals or orders against a number
    ("word = 1", False), ("word > 1", False), ("word <> 1", True),
    ("(price > 10 OR region = 'us') AND NOT vip = FALSE", True), ("TRUE", True), ("FALSE", False),
    ("price > 10 and region = 'eu-west' or false", True), ("price > -1", True), ("price > 2.5e1", False),
]


@pytest.mark.parametrize("expression, delivered", CASES, ids=[c[0] for c in CASES])
def test_a_condition_delivers_exactly_the_messages_it_describes(expression, delivered):
    assert compile_condition(expression).matches(PROPS, TAG) is delivered


BAD = [
    ("", "is empty"), ("price >", "a property, a number or a 'string' expected"),
    ("price > 'ten'", "> compares numbers"), ("price = 1 AND", "a property, a number or a 'string' expected"),
    ("(price > 1", "')' expected"), ("price > 1)", "unexpected ')'"), ("price", "a comparison"),
    ("price ! 1", "unexpected character"), ("region IN ()", "a 'string' expected"),
    ("region IN ('a' 'b')", "')' expected after the IN list"), ("price BETWEEN 1 OR 2", "AND expected in BETWEEN"),
    ("price IS 1", "NULL expected after IS"), ("price NOT = 1", "BETWEEN, IN, CONTAINS"),
    ("region = 'open", "unexpected character"), ("x" * (EXPRESSION_CHARS_MAX + 1), "at most 4096"),
    ("NOT " * (NESTING_MAX + 1) + "TRUE", "nested"), ("(" * (NESTING_MAX + 1) + "TRUE" + ")" * (NESTING_MAX + 1),
                                                       "nested"),
]


@pytest.mark.parametrize("expression, words", BAD, ids=[b[0][:40] or "empty" for b in BAD])
def test_a_malformed_expression_is_refused_with_what_is_wrong_and_where(expression, words):
    with pytest.raises(BadRequestError) as refused:
        compile_condition(expression)
    assert refused.value.code == Code.ILLEGAL_FILTER_EXPRESSION
    assert words in refused.value.message, refused.value.message


SQLISH = st.lists(st.sampled_from(["price", "region", "TAGS", "missing", "'a'", "'it''s'", "1", "-2.5", "TRUE",
                                   "NULL", "=", "<>", ">", "<=", "AND", "OR", "NOT", "(", ")", "IS", "IN", ",",
                                   "BETWEEN", "CONTAINS", "!", "''"]), max_size=12).map(" ".join)


@settings(max_examples=500, deadline=None)
@given(expression=st.one_of(SQLISH, st.text(max_size=60)),
       props=st.dictionaries(st.sampled_from(["price", "region", "missing"]), st.text(max_size=8)),
       tag=st.text(max_size=8))
def test_any_expression_either_compiles_and_decides_every_message_or_is_refused_by_name(expression, props, tag):
    try:
        condition = compile_condition(expression)
    except BadRequestError as refused:
        assert refused.code == Code.ILLEGAL_FILTER_EXPRESSION
        return
    assert condition.matches(props, tag) in (True, False)
