"""What of the files on this machine goes to a training job as code, and in which bytes.

``sourcedir``     a job's source directory packed as ``sourcedir.tar.gz``, as the SageMaker SDK packs it
``ignorefile``    the patterns of a source's ``.stabilizerignore``
``job_library``   the files of the in-job library every job's ``stabilizer`` channel holds

The floor under the client, local mode and the CDK app (infra/), which all pack sources here: it
imports none of them, and knows files and bytes only (it uploads nothing).
"""
