"""The Java Spark starts: found, and one of the versions Spark 4 supports (17, 21). Checked
before a session starts (``eospack.local_session``, the demo, ``eospack doctor``), so a
missing or wrong Java is one line naming the fix instead of a JVM launch trace."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from eospack.core.errors import EospackError

SUPPORTED_JAVA_MAJORS = (17, 21)


class JavaNotFoundError(EospackError, RuntimeError):
    """Java 17 or 21 is required by Spark 4.3 and was not found or has another version."""


def java_major_version(java_home: str | None = None) -> int:
    """Return the major version of the Java that Spark will start, or raise JavaNotFoundError."""
    java_home = java_home if java_home is not None else os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise JavaNotFoundError(
            "Java was not found: install Java 17 or 21"
            " (e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME to one"
        )
    output = subprocess.run(
        [java, "-version"], capture_output=True, text=True, timeout=30, check=False
    ).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', output)
    if not match:
        raise JavaNotFoundError(f"Could not read the version of {java}: install Java 17 or 21")
    major = int(match.group(1))
    return int(match.group(2)) if major == 1 and match.group(2) else major


def check_java(java_home: str | None = None) -> int:
    """Raise JavaNotFoundError unless the Java Spark will use is 17 or 21."""
    major = java_major_version(java_home)
    if major not in SUPPORTED_JAVA_MAJORS:
        raise JavaNotFoundError(
            f"Spark 4 needs Java 17 or 21 but found Java {major}: install one of them"
            " and point JAVA_HOME at it"
        )
    return major
