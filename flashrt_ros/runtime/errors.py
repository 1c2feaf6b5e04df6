"""Typed runtime errors, one per stable error code.

The codes themselves (``ErrorCode``) are the node's public contract and are declared in
``flashrt_ros.interface.errors`` (pure Python, no ROS); the ROS layer maps
``FlashRTError.code`` one-to-one onto the ``error_code`` of every service response.
"""
from __future__ import annotations

from flashrt_ros.interface.errors import ErrorCode

__all__ = ["ErrorCode", "FlashRTError", "CapsuleNotFound", "InvalidName", "AlreadyExists", "FingerprintMismatch",
           "LayoutMismatch", "CorruptCapsule", "BudgetExhausted", "NotActive", "Busy", "InvalidArgument",
           "CapsuleIOError", "ContextOverflow", "PinnedCapsule", "LeaseExpired", "StaleInputs", "InputRejected"]


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
