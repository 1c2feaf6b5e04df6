"""Typed runtime errors with stable numeric codes.

The ROS layer maps ``FlashRTError.code`` one-to-one onto the ``error_code``
constants of every service response, so these numbers are part of the public
interface: never renumber, only append.
"""
from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """Stable error codes shared by the runtime, the engines and the services."""

    OK = 0
    NOT_FOUND = 1
    INVALID_NAME = 2
    ALREADY_EXISTS = 3
    FINGERPRINT_MISMATCH = 4
    LAYOUT_MISMATCH = 5
    CORRUPT = 6
    BUDGET_EXHAUSTED = 7
    NOT_ACTIVE = 8
    BUSY = 9
    INVALID_ARGUMENT = 10
    IO_ERROR = 11
    CONTEXT_OVERFLOW = 12
    TIMEOUT = 13
    PINNED = 14
    CANCELLED = 15      # the node stopped the work (a goal ended by deactivate); a client's own
                        # cancel reports stop_reason "cancelled" with success
    LEASE_EXPIRED = 16  # a goal's client stopped renewing its lease (it died or hangs): the node ended it
    STALE_INPUTS = 17   # a RunPolicy goal waited longer than its stale_timeout_s for fresh inputs
    INPUT_REJECTED = 18  # ... while the node refused its input messages (their text names topic and why)
    INTERNAL = 99


class FlashRTError(Exception):
    """Base of every error the runtime raises on purpose; carries a code."""

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class CapsuleNotFound(FlashRTError):
    code = ErrorCode.NOT_FOUND


class InvalidName(FlashRTError):
    code = ErrorCode.INVALID_NAME


class AlreadyExists(FlashRTError):
    code = ErrorCode.ALREADY_EXISTS


class FingerprintMismatch(FlashRTError):
    code = ErrorCode.FINGERPRINT_MISMATCH


class LayoutMismatch(FlashRTError):
    code = ErrorCode.LAYOUT_MISMATCH


class CorruptCapsule(FlashRTError):
    code = ErrorCode.CORRUPT


class BudgetExhausted(FlashRTError):
    code = ErrorCode.BUDGET_EXHAUSTED


class NotActive(FlashRTError):
    code = ErrorCode.NOT_ACTIVE


class Busy(FlashRTError):
    code = ErrorCode.BUSY


class InvalidArgument(FlashRTError):
    code = ErrorCode.INVALID_ARGUMENT


class CapsuleIOError(FlashRTError):
    code = ErrorCode.IO_ERROR


class ContextOverflow(FlashRTError):
    code = ErrorCode.CONTEXT_OVERFLOW


class PinnedCapsule(FlashRTError):
    code = ErrorCode.PINNED


class LeaseExpired(FlashRTError):
    code = ErrorCode.LEASE_EXPIRED


class StaleInputs(FlashRTError):
    code = ErrorCode.STALE_INPUTS


class InputRejected(FlashRTError):
    code = ErrorCode.INPUT_REJECTED
