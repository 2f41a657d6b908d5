package coverage

import (
	"fmt"
	"slices"
	"strings"
)

// FailoverReadiness says whether a physical standby of the source, once promoted, could continue a
// slot with no gap: the readiness check of PostgreSQL 17 docs §29.3 "Logical Replication
// Failover". The decisive part of that check runs on the standby (StandbyChecks, from `status` and
// `coverage --standby URL`); from the primary alone it shows what the primary knows: the slot's
// failover property, synchronized_standby_slots and the physical slots the standbys stream
// through. Reported for sources of PostgreSQL 17 and later only.
type FailoverReadiness struct {
	// Enabled is the slot's failover property (pg_replication_slots.failover): standbys with
	// sync_replication_slots = on keep a copy of it.
	Enabled bool `json:"enabled"`
	// SynchronizedStandbySlots is the primary's synchronized_standby_slots, the physical slots
	// whose standbys must have flushed WAL before the walsender of a failover slot sends its
	// changes: the target never holds a change such a standby lacks. Empty when unset.
	SynchronizedStandbySlots []string `json:"synchronized_standby_slots"`
	// PhysicalSlots are the source's physical slots (pg_replication_slots), by name: standbys
	// sync slots only through one (primary_slot_name).
	PhysicalSlots []PhysicalSlot `json:"physical_slots"`
	// StandbyChecks are the checks run on the standbys given (--standby), in their order.
	StandbyChecks []StandbyCheck `json:"standby_checks,omitempty"`
	// Ready is true when every standby checked holds the slot ready for failover (StandbyCheck.Ready)
	// and at least one was checked; false when none was.
	Ready bool `json:"ready"`
	// Warnings say what stands in the way of a failover without a gap, each with its fix.
	Warnings []string `json:"warnings,omitempty"`
}

// PhysicalSlot is one physical slot of the source as pg_replication_slots shows it.
type PhysicalSlot struct {
	Name string `json:"name"`
	// Active is true while a standby streams through it.
	Active bool `json:"active"`
	// Synchronized is true when synchronized_standby_slots names it.
	Synchronized bool `json:"synchronized"`
	// Feedback is true when the slot holds an xmin or catalog_xmin, which only a standby's
	// hot_standby_feedback sets; a standby with the setting on may not have sent any yet (it does
	// every wal_receiver_status_interval), so the setting itself is checked on the standby
	// (StandbyCheck.HotStandbyFeedback).
	Feedback bool `json:"feedback"`
	// RestartLSN is the oldest WAL position the slot keeps; nil when it keeps none yet.
	RestartLSN *LSN `json:"restart_lsn"`
}

// StandbyCheck is the readiness query of docs §29.3 run on one standby: `select (synced and not
// temporary and invalidation_reason is null) from pg_replication_slots where slot_name = …`.
type StandbyCheck struct {
	// Standby is the standby's address (host:port/database), without credentials.
	Standby string `json:"standby"`
	// Error is why the standby could not be checked; "" when it was.
	Error string `json:"error,omitempty"`
	// InRecovery is pg_is_in_recovery(): false for a server that is no standby (or was promoted).
	InRecovery bool `json:"in_recovery"`
	// SyncReplicationSlots and HotStandbyFeedback are the standby's settings of those names, both
	// needed for it to keep a usable copy of a failover slot.
	SyncReplicationSlots bool `json:"sync_replication_slots"`
	HotStandbyFeedback   bool `json:"hot_standby_feedback"`
	// Exists is true when the standby has a slot of that name; Synced, Temporary and
	// InvalidationReason are its columns (a temporary synced slot is not persisted yet: its
	// standby has not replayed up to the primary slot's position).
	Exists             bool   `json:"exists"`
	Synced             bool   `json:"synced"`
	Temporary          bool   `json:"temporary"`
	InvalidationReason string `json:"invalidation_reason,omitempty"`
	// ConfirmedFlushLSN is the standby copy's confirmed_flush_lsn: a promoted standby's slot
	// streams from there at the earliest (the daemon resumes from the target's progress, at or
	// after it).
	ConfirmedFlushLSN *LSN `json:"confirmed_flush_lsn"`
	// Ready is the docs' failover_ready: in recovery, synced, not temporary, not invalidated.
	Ready bool `json:"ready"`
}

// Assess sets r.Ready and r.Warnings for slot from the other fields.
func (r *FailoverReadiness) Assess(slot string) {
	r.Warnings = nil
	warn := func(format string, a ...any) { r.Warnings = append(r.Warnings, fmt.Sprintf(format, a...)) }
	if !r.Enabled {
		warn("slot %q is not a failover slot: no standby keeps a copy, and after a failover the daemon creates a new slot and backfills the gap; pgconverge run (--failover-slot, on by default) makes it one when it next starts", slot)
	}
	physical := map[string]PhysicalSlot{}
	for _, p := range r.PhysicalSlots {
		physical[p.Name] = p
	}
	if len(r.PhysicalSlots) == 0 {
		warn("the source has no physical replication slot: a standby syncs failover slots only through one (primary_slot_name on the standby)")
	}
	if len(r.SynchronizedStandbySlots) == 0 {
		warn("synchronized_standby_slots is not set on the source: the daemon may receive and apply changes a standby has not received yet, which a promoted standby lacks; set it to the standbys' physical slots")
	}
	for _, name := range r.SynchronizedStandbySlots {
		p, ok := physical[name]
		switch {
		case !ok:
			warn("synchronized_standby_slots names %q, which is no physical slot of the source: the slot's walsender waits for it and streams nothing", name)
		case !p.Active:
			warn("physical slot %q, named in synchronized_standby_slots, has no standby streaming through it: the slot's walsender waits for it and streams nothing until it returns or is taken out of synchronized_standby_slots", name)
		}
	}
	r.Ready = len(r.StandbyChecks) > 0
	for _, c := range r.StandbyChecks {
		r.Ready = r.Ready && c.Ready
		switch {
		case c.Error != "":
			warn("standby %s could not be checked: %s", c.Standby, c.Error)
		case !c.InRecovery:
			warn("%s is not in recovery: it is no standby (promoted?)", c.Standby)
		case !c.HotStandbyFeedback:
			warn("standby %s has hot_standby_feedback off: the primary may remove catalog rows its copy of slot %q needs, which invalidates the copy; set hot_standby_feedback = on", c.Standby, slot)
		case !c.Exists:
			warn("standby %s has no copy of slot %q yet: it needs sync_replication_slots = on (now %v), primary_slot_name, hot_standby_feedback = on and dbname in primary_conninfo", c.Standby, slot, c.SyncReplicationSlots)
		case !c.Ready:
			warn("standby %s holds slot %q but not ready for failover (synced %v, temporary %v, invalidation_reason %q): a temporary copy becomes ready once the standby has replayed up to the slot's position on the primary", c.Standby, slot, c.Synced, c.Temporary, c.InvalidationReason)
		}
	}
}

// Synchronized sets SynchronizedStandbySlots and marks the physical slots synchronized_standby_slots names (Synchronized), from
// its text value: a comma-separated list of slot names.
func (r *FailoverReadiness) Synchronized(setting string) {
	r.SynchronizedStandbySlots = []string{}
	for _, name := range strings.Split(setting, ",") {
		if name = strings.TrimSpace(name); name != "" {
			r.SynchronizedStandbySlots = append(r.SynchronizedStandbySlots, name)
		}
	}
	for i, p := range r.PhysicalSlots {
		r.PhysicalSlots[i].Synchronized = slices.Contains(r.SynchronizedStandbySlots, p.Name)
	}
}
