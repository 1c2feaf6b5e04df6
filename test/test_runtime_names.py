"""Capsule name validation: file-name safe, bounded, never a path."""
from __future__ import annotations

import pytest

from flashrt_ros.runtime.errors import ErrorCode, InvalidName
from flashrt_ros.runtime.names import MAX_NAME_LENGTH, validate_capsule_name


@pytest.mark.parametrize("name", ["a", "turn-3", "chat_01.v2", "A.b-C_d", "x" * MAX_NAME_LENGTH, "a..b"])
def test_valid_names_are_returned_unchanged(name):
    assert validate_capsule_name(name) == name


@pytest.mark.parametrize("name", ["../x", "/abs", "a/b", "a\\b", ".", "..", ".hidden", "", "sp ace",
                                  "tab\t", "nul\x00", "ünï", "x" * (MAX_NAME_LENGTH + 1), None, 3])
def test_invalid_names_are_refused_with_invalid_name(name):
    with pytest.raises(InvalidName) as info:
        validate_capsule_name(name)
    assert info.value.code == ErrorCode.INVALID_NAME


def test_path_separators_are_named_in_the_message():
    with pytest.raises(InvalidName, match="path separator"):
        validate_capsule_name("a/b")


def test_ten_megabyte_name_is_refused_on_its_length_without_echoing_it():
    name = "a" * (10 * 1024 * 1024)
    with pytest.raises(InvalidName, match="characters long") as info:   # the length check, not a scan
        validate_capsule_name(name)
    assert len(str(info.value)) < 200
    assert str(len(name)) in str(info.value)
