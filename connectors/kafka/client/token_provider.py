"""OAUTHBEARER tokens from a provider that ``kafka.sasl.oauth.token.provider`` names.

Why a name: Spark options are strings, and each process that talks to Kafka (the driver,
Spark's planner processes, every executor's Python workers) builds its own clients. So the
option names an importable object, ``module:function`` or ``module:Class``, and each
process imports it itself; AWS MSK IAM needs exactly this from Python (a function that
returns ``MSKAuthTokenProvider.generate_auth_token(region)``, docs/connectors/kafka-security.md).

What the name may point at (``resolve``):

- a kafka-python ``AbstractTokenProvider`` subclass, or any class whose instances have a
  ``token()`` method: instantiated once per process, without arguments;
- such an instance (a module-level object): used as it is;
- a function: called for every token; it returns the token, or a ``(token, expiry)`` pair
  as ``MSKAuthTokenProvider.generate_auth_token`` does.

What is guaranteed:

- ``TokenProvider`` is what kafka-python's OAUTHBEARER mechanism takes; it pickles as the
  name only (``provider_for(name)`` on unpickling), so options objects travel to executors
  without the user's object and never with a token. Its repr is the option and the name.
- ``provider_for`` imports the object and asks it for one token before it returns, once
  per process (cached by name): the driver does it when the options are parsed, at query
  start, and an executor when it receives a task's options, before any client connects.
  A name that cannot be imported, or an object of the wrong kind, raises
  ``TokenProviderNameError`` (the formats turn it into their option error); a provider
  that raises or returns no token raises ``KafkaAuthenticationError``. Both are one line
  naming the option; neither ever holds a token (the provider gave none).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import threading
from collections.abc import Callable
from typing import Any

from kafka.net.sasl.oauth import AbstractTokenProvider

from ..errors import KafkaAuthenticationError, TokenProviderNameError

OPTION = "kafka.sasl.oauth.token.provider"
KINDS = (
    "module:function or module:Class (a kafka-python AbstractTokenProvider, an object with"
    " a token() method, or a function returning the token)"
)


class TokenProvider(AbstractTokenProvider):
    """The provider ``name`` points at, as kafka-python's OAUTHBEARER mechanism takes it.

    One per name and process (``provider_for``): equal options give equal client settings,
    so caches keyed by them (clients, cluster facts) keep working."""

    def __init__(self, name: str, token: Callable[[], Any], extensions: Callable[[], Any]):
        super().__init__()
        self.name = name
        self._token = token
        self._extensions = extensions

    def token(self) -> str:
        try:
            return _token_text(self._token())
        except Exception as error:  # a provider failing later is the same one line
            why = f"{type(error).__name__}: {' '.join(str(error).split())}"
            raise _no_token(self.name, why) from None

    def extensions(self) -> dict[str, str]:
        return dict(self._extensions() or {})

    def __reduce__(self) -> tuple[Callable[[str], TokenProvider], tuple[str]]:
        return provider_for, (self.name,)

    def __repr__(self) -> str:
        return f"TokenProvider({OPTION}={self.name})"


def _token_text(given: Any) -> str:
    """The token of what a provider returned: a string, or a pair whose first item is one."""
    if isinstance(given, tuple) and given:
        given = given[0]
    if not isinstance(given, str) or not given:
        raise TypeError(f"it returned {type(given).__name__}, not a token string")
    return given


def resolve(name: str) -> TokenProvider:
    """Import ``name`` and wrap what it points at (module doc); no token asked yet."""
    module_name, _, attribute = name.partition(":")
    if not module_name.strip() or not attribute.strip():
        raise TokenProviderNameError(f"Option {OPTION} is {name!r}: use {KINDS}")
    try:
        target: Any = getattr(importlib.import_module(module_name.strip()), attribute.strip())
    except Exception as error:  # any import failure is the same fix: make it importable
        raise TokenProviderNameError(
            f"Option {OPTION} names {name}, which cannot be imported"
            f" ({type(error).__name__}: {error}): install the module on the driver and every"
            " executor (e.g. spark.submit.pyFiles or SparkContext.addPyFile)"
        ) from None
    if inspect.isclass(target) and callable(getattr(target, "token", None)):
        try:
            target = target()
        except Exception as error:
            raise TokenProviderNameError(
                f"Option {OPTION} names the class {name}, which cannot be built without"
                f" arguments ({type(error).__name__}: {' '.join(str(error).split())}): name a"
                " function that builds it with its arguments instead"
            ) from None
    if callable(getattr(target, "token", None)):
        extensions = getattr(target, "extensions", None)
        return TokenProvider(name, target.token, extensions if callable(extensions) else dict)
    if callable(target) and not inspect.isclass(target):
        return TokenProvider(name, target, dict)
    raise TokenProviderNameError(
        f"Option {OPTION} names {name}, {_article(type(target).__name__)}: use {KINDS}"
    )


def _article(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


FIRST_TOKEN_TIMEOUT_SECONDS = 60.0
"""How long the first token may take: a provider that hangs fails the query start."""


def _first_token(provider: TokenProvider) -> Any:
    """``provider``'s first raw answer, asked on a daemon thread so a hang is bounded."""
    answer: list[Any] = []
    failure: list[BaseException] = []

    def ask() -> None:
        try:
            answer.append(provider._token())
        except Exception as error:
            failure.append(error)

    thread = threading.Thread(target=ask, name="eospack-first-token", daemon=True)
    thread.start()
    thread.join(FIRST_TOKEN_TIMEOUT_SECONDS)
    if failure:
        raise failure[0]
    if not answer:
        raise TimeoutError(f"it did not answer within {FIRST_TOKEN_TIMEOUT_SECONDS:g} s")
    return answer[0]


@functools.cache
def provider_for(name: str) -> TokenProvider:
    """The provider of ``name`` in this process, after one token was asked of it (module
    doc); a failure is not cached, so the next call tries again."""
    provider = resolve(name)
    try:
        given = _first_token(provider)
    except Exception as error:
        raise _no_token(name, f"{type(error).__name__}: {' '.join(str(error).split())}") from None
    try:
        _token_text(given)
    except TypeError as error:
        raise _no_token(name, str(error)) from None
    return provider


def _no_token(name: str, why: str) -> KafkaAuthenticationError:
    return KafkaAuthenticationError(
        f"The token provider {name} (option {OPTION}) gave no token ({why}): fix the"
        " provider; it runs on the driver and on every executor"
    )
