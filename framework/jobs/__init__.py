"""Layer 3, resumable batch generation (``adec generate``), split by concern: planning and input
checks (:mod:`.plan`), the adaptive batch size (:mod:`.batcher`), the results file
(:mod:`.output`), faults and guards (:mod:`.errors`, :mod:`.guards`), the summary
(:mod:`.summary`) and the job itself (:mod:`.runner`)."""

from adaptive_decoding.framework.jobs.errors import JobInputError, OutputFileError
from adaptive_decoding.framework.jobs.options import JobOptions
from adaptive_decoding.framework.jobs.output import (
           RESULT_FIELDS,
           RowSchemaError,
           read_results,
           validate_row,
)
from adaptive_decoding.framework.jobs.plan import check_items, check_job_options
from adaptive_decoding.framework.jobs.runner import run_generation_job

__all__ = ["JobInputError", "JobOptions", "OutputFileError", "RESULT_FIELDS", "RowSchemaError", "check_items",
           "check_job_options", "read_results", "run_generation_job", "validate_row"]
