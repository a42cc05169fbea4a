//! One conformance suite, two backends: every scenario in `tests/conformance/` runs
//! against the in-memory `TestKit` (`conformance::kit::…`) and against the Postgres
//! engine on a manual clock (`conformance::pg::…`), so the kit cannot drift from the
//! engine. `tests/conformance/kit_only.rs` holds what only the kit has (determinism,
//! the runaway guard, assertion messages).
//!
//! ```sh
//! cargo test --test conformance kit::   # the kit only
//! cargo test --test conformance pg::    # Postgres only
//! ```

#[path = "../common/mod.rs"]
mod common;

mod backend;
mod children;
mod explain;
mod fsms;
mod gates;
mod history;
mod keys;
mod kit_only;
mod migrations;
mod model;
mod operator;
mod outcomes;
mod rate_limits;
mod scheduling;
mod signals;
mod transitions;
mod waits;

use backend::Backend;

/// Declares every scenario once; generates one test per backend.
macro_rules! conformance {
    ($($module:ident :: $name:ident),+ $(,)?) => {
        mod kit {
            $(
                #[tokio::test]
                async fn $name() {
                    let mut b = crate::backend::Kit::new(stringify!($name));
                    crate::$module::$name(&mut b).await;
                    crate::Backend::close(b).await;
                }
            )+
        }
        mod pg {
            $(
                #[tokio::test]
                async fn $name() {
                    let mut b = crate::backend::Pg::new(stringify!($name)).await;
                    crate::$module::$name(&mut b).await;
                    crate::Backend::close(b).await;
                }
            )+
        }
        /// Every scenario's name, for the count check.
        pub const SCENARIOS: &[&str] = &[$(stringify!($name)),+];
    };
}

conformance! {
    history::every_committed_step_is_the_same_entry_on_both_engines,
    history::a_lost_lease_shows_in_the_history,
    history::operator_actions_are_entries_with_their_actor,
    history::a_fork_from_a_past_step_runs_to_the_end_and_the_original_is_untouched,
    history::a_fork_or_restart_from_a_bad_entry_is_refused_and_writes_nothing,
    gates::a_gate_of_two_runs_every_row_and_never_three_steps_of_one_key,
    gates::an_undeclared_gate_is_refused_and_nothing_is_written,
    gates::declaring_a_gate_is_idempotent_and_a_new_limit_replaces_the_old,
    gates::a_gate_key_and_a_partition_key_of_the_same_text_are_different_keys,
    gates::each_key_of_a_gate_has_its_own_slots,
    gates::raising_a_gates_limit_admits_more_at_the_next_pick,
    rate_limits::each_key_of_a_rate_limit_has_its_own_bucket,
    rate_limits::tokens_go_to_rows_in_priority_order,
    rate_limits::a_heavier_row_takes_more_tokens_and_waits_longer,
    rate_limits::a_row_cancelled_while_waiting_for_tokens_fails_and_keeps_the_others_times,
    rate_limits::a_rate_limit_admits_its_burst_then_one_row_per_token,
    rate_limits::a_rate_limit_admits_the_same_while_a_gate_is_declared,
    explain::explain_gate_full_names_the_gate_and_its_use,
    explain::explain_rate_limited_says_when_its_tokens_are_due,
    rate_limits::a_replay_of_the_limited_step_pays_again,
    rate_limits::an_unknown_limit_or_a_weight_above_the_burst_is_refused_and_writes_nothing,
    rate_limits::r4_1_a_restart_or_a_cancel_and_retry_of_reserved_rows_starts_none_early,
    rate_limits::r4_2_reservations_claimed_late_do_not_exceed_the_burst,
    rate_limits::r4_5_a_reservation_beyond_the_interval_range_does_not_stop_its_queue,
    rate_limits::a_reservation_is_due_when_its_token_is_whole_not_a_microsecond_before,
    transitions::a_transition_takes_a_partition_key_and_a_later_one_releases_it,
    transitions::a_transition_into_a_gate_runs_at_most_k_steps_of_the_key,
    transitions::what_the_database_refuses_of_a_transition_stops_the_instance_with_the_refusal,
    transitions::a_transitions_rate_limit_applies_to_the_step_it_leads_to_and_no_other,
    transitions::a_steps_declared_rate_limit_applies_on_every_transition_into_it_and_at_insert,
    keys::a_signal_by_key_reaches_its_holder,
    keys::a_key_no_instance_holds_is_key_not_found,
    keys::a_finished_holder_frees_its_key_for_a_new_run,
    keys::a_finished_holder_in_scope_keeps_its_key_and_is_finished,
    keys::an_empty_scope_makes_a_key_neither_unique_nor_an_address,
    keys::a_child_holds_its_key,
    keys::dedup_by_key_is_per_holder,
    keys::bad_keys_are_typed_errors_that_write_nothing,
    keys::unique_key_is_the_correlation_key,
    keys::a_cancel_frees_the_key_and_a_retry_takes_it_back,
    keys::a_retry_whose_key_was_taken_meanwhile_is_a_duplicate,
    keys::insert_all_rows_are_addressed_by_their_keys,
    keys::an_instance_is_looked_up_and_asserted_by_its_key,
    keys::a_failed_holder_with_failed_in_scope_is_finished,
    waits::a_wait_by_key_follows_the_current_holder,
    waits::wait_answers_done_with_the_result_by_id_and_by_key,
    waits::wait_answers_failed_with_the_last_error,
    waits::wait_answers_parked_unless_until_terminal,
    waits::wait_on_nothing_is_gone_or_key_not_found,
    outcomes::next_runs_steps_in_order_and_resets_attempt,
    outcomes::replay_waits_for_the_clock_and_counts_attempts,
    outcomes::await_parks_until_a_matching_signal,
    outcomes::schedule_children_with_no_children_continues_at_once,
    outcomes::done_records_the_result_and_deletes_the_inbox,
    outcomes::stop_fails_keeping_attempt_and_deleting_the_inbox,
    outcomes::an_err_goes_to_handle,
    outcomes::a_panic_goes_to_handle,
    outcomes::a_failing_handle_fails_the_instance,
    outcomes::the_default_handle_stops_with_the_error,
    outcomes::handle_sees_the_last_committed_state,
    outcomes::an_uncastable_state_fails_without_handle,
    outcomes::ctx_now_is_the_clock,
    signals::signal_errors_store_nothing,
    signals::a_stray_signal_does_not_wake_and_stays,
    signals::a_signal_before_parking_wakes_at_commit,
    signals::an_any_of_await_takes_the_signal_sent,
    signals::re_awaiting_accumulates_without_a_busy_loop,
    signals::dedup_key_stores_once_while_stored,
    signals::replay_re_sees_the_awaited_signal,
    signals::a_same_name_signal_during_a_step_survives_consumption,
    signals::await_timeout_fires_only_when_the_clock_passes_it,
    signals::a_signal_beats_the_timeout,
    children::four_children_done_wake_the_parent,
    children::a_failing_child_is_counted_not_fatal,
    children::the_parent_waits_for_every_child,
    children::children_nest_two_levels,
    children::children_dropped_by_uniqueness_are_not_awaited,
    scheduling::priorities_order_the_runs,
    scheduling::schedule_in_is_never_early,
    scheduling::insert_at_a_named_step_and_reject_unknown_steps,
    scheduling::unique_key_default_scope_frees_at_terminal,
    scheduling::a_unique_scope_a_row_could_re_enter_is_refused,
    scheduling::insert_all_drops_stored_and_batch_duplicates_not_null_keys,
    scheduling::cancel_fails_a_parked_instance_and_its_children,
    scheduling::cancelling_a_child_counts_its_parent_down,
    scheduling::retry_runs_a_failed_instance_again,
    scheduling::a_retry_after_a_cancel_while_parked_awaits_again,
    scheduling::a_retry_of_a_failed_step_woken_by_a_signal_awaits_again,
    scheduling::a_retry_of_a_failed_step_woken_by_its_timeout_runs_it_again,
    scheduling::retry_refuses_a_unique_key_taken_meanwhile,
    scheduling::one_partition_never_runs_two_steps_at_once,
    scheduling::a_cron_schedule_fires_on_the_clock,
    scheduling::r4b_1_a_redeclared_schedule_fires_by_its_new_pattern_at_once,
    scheduling::r4b_3_a_panicking_schedule_entry_skips_its_fire_time_and_the_others_go_on,
    migrations::a_runnable_old_row_is_migrated_on_claim_and_runs_on_the_new_version,
    migrations::a_chain_moves_a_row_through_every_version_at_once,
    migrations::a_failing_transform_leaves_the_row_on_its_version_and_retries_after_the_backoff,
    migrations::a_panicking_transform_is_a_failed_migration,
    migrations::a_parked_row_migrated_in_bulk_continues_at_the_mapped_step,
    migrations::a_bulk_dry_run_reports_and_changes_nothing,
    migrations::a_bulk_migration_without_a_chain_is_no_migration_and_changes_nothing,
    migrations::a_removed_step_is_mapped_to_its_replacement,
    migrations::a_node_without_the_new_version_runs_the_old_one,
    migrations::a_failed_migration_keeps_the_signal_that_woke_the_row,
    explain::explain_done_shows_the_result,
    explain::explain_failed_shows_the_last_error,
    explain::explain_executing_names_the_node_and_its_lease,
    explain::explain_awaiting_a_signal_names_it_the_deadline_and_the_unrelated_inbox,
    explain::explain_awaiting_children_lists_the_unfinished_ones,
    explain::explain_paused_names_since_when_and_why,
    explain::explain_scheduled_names_the_time,
    explain::explain_backoff_names_the_attempt_and_the_time,
    explain::explain_partition_blocked_names_the_holder,
    explain::explain_runnable_counts_the_rows_ahead_in_pick_order,
    explain::explain_by_key_and_of_nothing,
    operator::a_paused_queue_runs_nothing_until_resumed_and_other_queues_go_on,
    operator::pausing_is_idempotent_and_keeps_the_first_reason,
    operator::a_parked_instance_of_a_paused_queue_is_woken_and_runs_after_the_resume,
    operator::restart_runs_a_done_instance_again_from_a_named_step,
    operator::restart_moves_a_parked_instance_to_a_step_keeping_its_inbox,
    operator::restart_refuses_an_unknown_step_or_instance_and_changes_nothing,
    operator::restart_of_a_finished_child_rearms_a_waiting_parent_not_one_that_moved_on,
    operator::restart_refuses_a_parent_with_live_children,
    operator::restart_of_a_finished_instance_whose_key_is_held_is_a_duplicate,
    operator::a_bulk_dry_run_counts_and_changes_nothing,
    operator::cancel_where_cancels_the_matches_with_their_live_children,
    operator::retry_where_retries_the_failed_matches_and_skips_a_taken_key,
    operator::bulk_filters_take_a_key_an_insert_time_a_parent_and_an_error_text,
}

#[test]
fn the_suite_has_at_least_25_scenarios() {
    assert!(SCENARIOS.len() >= 25, "{}", SCENARIOS.len());
}
