"""The error of the SDK adaptation: an SDK object asks for something stabilizer's job cannot be.

Its own small module, so that describing a job (stabilizer.client.sdk) and putting its files on AWS
(stabilizer.client.sdk_aws) both raise it without importing each other.
"""

from __future__ import annotations


class SdkJobError(ValueError):
    """The SDK object asks for something stabilizer's job cannot be; the message names the attribute."""
