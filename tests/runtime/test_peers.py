"""The line a process of a pod run ends with when the coordination service counts processes lost."""

from glmrl.checkpoint.manager import resume_point
from glmrl.runtime import peers

NONE_SAVED = "no checkpoint of this run is complete"


def test_a_lost_peer_is_named_with_the_heartbeat_bound_and_where_to_resume():
  assert peers._lost_line(0, [1], 15, NONE_SAVED) == (
      "error: process 0: process 1 of the run is lost (sent no heartbeat for 15 s: killed, out of memory, or its "
      "host is gone); no checkpoint of this run is complete: start every process again to resume")
  assert peers._lost_line(1, [0], 15, NONE_SAVED).startswith(
      "error: process 1: process 0 of the run is lost (its coordination service stopped answering: ")


def test_a_live_process_counted_lost_says_its_heartbeats_came_late_and_names_the_flag():
  # What a host too busy for its heartbeats meets: the service counts every process lost, this one included.
  assert peers._lost_line(0, [0, 1], 15, NONE_SAVED) == (
      "error: process 0: the coordination service counted processes 0, 1 lost (sent no heartbeat for 15 s), this "
      "live one included: their heartbeats came late, a host too busy to send them; raise "
      "--distributed_heartbeat_timeout (now 15 s); no checkpoint of this run is complete: start every process "
      "again to resume")
  assert "counted process 1 lost" in peers._lost_line(1, [1], 100, NONE_SAVED)


def test_where_a_run_resumes_from_is_its_last_complete_checkpoint(tmp_path):
  assert resume_point(str(tmp_path)) == NONE_SAVED
