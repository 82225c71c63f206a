"""What the activity interceptor makes of an error: scrubbed text, nothing else changed.

A plain exception is recorded exactly as the SDK's own failure converter records it
(its class name as type, retryable, its traceback and its cause), except that the
worker's secrets in its text (and its cause's) become ``[redacted]``. Temporal's own
failures (cancellation above all) pass through untouched.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.api.failure.v1 import Failure
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory, CancelledError

from playline.calls.http import REDACTED, SecretScrubber
from playline.errors import InvalidPlayInput
from playline.interceptors import scrubbed_error, to_application_error

SECRET = "sk_live_0123456789"
scrub = SecretScrubber([SECRET])


def recorded(err: BaseException) -> Failure:
    """The failure Temporal's default converter records for ``err``."""
    failure = Failure()
    DataConverter.default.failure_converter.to_failure(
        err, DataConverter.default.payload_converter, failure
    )
    return failure


def raised(err: BaseException, cause: BaseException | None = None) -> BaseException:
    """``err`` as an activity raises it: with a traceback, chained to ``cause``."""
    try:
        raise err from cause
    except BaseException as caught:
        return caught


def test_a_plain_exception_is_recorded_as_the_sdk_records_it_but_scrubbed() -> None:
    err = raised(ValueError(f"lookup with key {SECRET} failed"), KeyError(f"no {SECRET}"))
    before = recorded(err)
    after = recorded(scrubbed_error(err, scrub))

    assert after.message == f"lookup with key {REDACTED} failed"
    assert after.cause.message == f"'no {REDACTED}'"
    assert SECRET not in str(after)
    # Everything else is what the SDK made of the original.
    for failure in (before, after):
        failure.message = failure.cause.message = ""
    assert after == before
    assert after.application_failure_info.type == "ValueError"
    assert not after.application_failure_info.non_retryable
    assert after.stack_trace and after.cause.application_failure_info.type == "KeyError"


def test_an_error_without_a_secret_is_left_as_it_is() -> None:
    err = raised(RuntimeError("nothing to hide"), KeyError("nor here"))
    assert scrubbed_error(err, scrub) is err
    application = ApplicationError("fine", type="Mine", non_retryable=True)
    assert scrubbed_error(application, scrub) is application


def test_an_application_error_keeps_its_type_retry_details_and_category() -> None:
    err = ApplicationError(
        f"quoting {SECRET}",
        {"row": 3},
        type="UpstreamRefused",
        non_retryable=True,
        next_retry_delay=timedelta(seconds=7),
        category=ApplicationErrorCategory.BENIGN,
    )
    clean = scrubbed_error(err, scrub)
    assert isinstance(clean, ApplicationError)
    assert clean.message == f"quoting {REDACTED}"
    assert (clean.type, clean.non_retryable, clean.next_retry_delay, clean.category) == (
        "UpstreamRefused",
        True,
        timedelta(seconds=7),
        ApplicationErrorCategory.BENIGN,
    )
    assert list(clean.details) == [{"row": 3}]


def test_cancellation_and_other_temporal_failures_pass_through() -> None:
    cancelled = CancelledError(f"cancelled {SECRET}")
    assert scrubbed_error(cancelled, scrub) is cancelled
    interrupt = KeyboardInterrupt(SECRET)
    assert scrubbed_error(interrupt, scrub) is interrupt


def test_a_playline_error_is_scrubbed_and_keeps_its_type_and_retry() -> None:
    err = InvalidPlayInput(f"the header has ['ACME_API_KEY={SECRET}']")
    translated = to_application_error(err, scrub)
    assert translated.message == f"the header has ['ACME_API_KEY={REDACTED}']"
    assert translated.type == "InvalidPlayInput"
    assert translated.non_retryable
