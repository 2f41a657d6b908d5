package coverage

import (
	"fmt"
)

// SlotHealth is what the source says of a replication slot's hold on WAL (PostgreSQL docs §54.19,
// pg_replication_slots; §20.6.1, max_slot_wal_keep_size).
type SlotHealth struct {
	Name   string `json:"name"`
	Exists bool   `json:"exists"`
	// Plugin is the slot's output plugin: "pgoutput" for pgconverge's slot, "" for a physical slot.
	Plugin string `json:"plugin"`
	// Active is true while a walsender streams from the slot (a running daemon).
	Active bool `json:"active"`
	// WALStatus is reserved, extended, unreserved or lost ("" when the slot is missing).
	WALStatus string `json:"wal_status"`
	// SafeWALSizeBytes is how many bytes of WAL can still be written before the slot is at risk of
	// being invalidated; nil when max_slot_wal_keep_size is -1 (unlimited) or the slot is lost.
	SafeWALSizeBytes *int64 `json:"safe_wal_size_bytes"`
	// RestartLSN is the oldest WAL position the slot keeps; RestartLagBytes the WAL it holds back.
	RestartLSN      *LSN   `json:"restart_lsn"`
	RestartLagBytes uint64 `json:"restart_lag_bytes"`
	// ConfirmedFlushLSN is the position the consumer confirmed.
	ConfirmedFlushLSN *LSN `json:"confirmed_flush_lsn"`
	// InvalidationReason is why the source invalidated the slot (pg_replication_slots
	// invalidation_reason on PostgreSQL 17 and later, "conflicting" on 16), "" while it is valid
	// or when the source does not say.
	InvalidationReason string `json:"invalidation_reason,omitempty"`
	// MaxSlotWALKeepSizeBytes is the source's max_slot_wal_keep_size in bytes, -1 for unlimited.
	MaxSlotWALKeepSizeBytes int64 `json:"max_slot_wal_keep_size_bytes"`
	// Warning says when the slot is lost, missing or at risk of losing WAL; "" when healthy.
	Warning string `json:"warning,omitempty"`
	// Failover is whether a promoted standby could continue the slot (PostgreSQL 17 and later;
	// nil before, or when the slot is missing).
	Failover *FailoverReadiness `json:"failover,omitempty"`
}

// riskFraction is the share of max_slot_wal_keep_size below which a slot's safe_wal_size warns.
const riskFraction = 0.2

// Assess sets h.Warning from the other fields: a missing slot, one that is not a pgoutput logical
// slot, one that is lost or unreserved, or one whose safe_wal_size fell below riskFraction of
// max_slot_wal_keep_size; "" when healthy.
func (h *SlotHealth) Assess() {
	if !h.Exists {
		h.Warning = fmt.Sprintf("slot %q does not exist in this database: changes after the watermark were not kept for pgconverge; pgconverge run creates a new slot and, with --on-gap=backfill, backfills the gap", h.Name)
		return
	}
	h.Warning = h.risk()
}

// risk returns the warning for an existing slot, or "".
func (h SlotHealth) risk() string {
	switch {
	case h.Plugin != "pgoutput":
		return fmt.Sprintf("slot %q is not a pgoutput logical slot (plugin %q): it is not the stream's slot, which was dropped; pgconverge run refuses it until it is dropped", h.Name, h.Plugin)
	case h.InvalidationReason != "" && h.InvalidationReason != "wal_removed":
		return fmt.Sprintf("slot %q is invalidated (invalidation_reason %s): it can no longer stream, so changes after the watermark are lost; pgconverge run replaces the slot and, with --on-gap=backfill, backfills the gap", h.Name, h.InvalidationReason)
	case h.WALStatus == "lost":
		return fmt.Sprintf("slot %q is invalidated (wal_status lost): the source removed WAL it still needed, so changes after the watermark are lost; pgconverge run replaces the slot and, with --on-gap=backfill, backfills the gap", h.Name)
	case h.WALStatus == "unreserved":
		return fmt.Sprintf("slot %q holds more WAL than max_slot_wal_keep_size (wal_status unreserved): the next checkpoint removes WAL it needs unless the stream catches up first", h.Name)
	case h.SafeWALSizeBytes != nil && h.MaxSlotWALKeepSizeBytes > 0 && float64(*h.SafeWALSizeBytes) < riskFraction*float64(h.MaxSlotWALKeepSizeBytes):
		return fmt.Sprintf("slot %q is at risk: only %s of WAL may be written before the source invalidates it (max_slot_wal_keep_size %s); make sure pgconverge run is streaming and keeping up",
			h.Name, HumanBytes(uint64(max(*h.SafeWALSizeBytes, 0))), HumanBytes(uint64(h.MaxSlotWALKeepSizeBytes)))
	}
	return ""
}

// Invalidated reports whether the source invalidated the slot (wal_status lost, or any
// invalidation reason): its stream cannot deliver what follows the watermark.
func (h SlotHealth) Invalidated() bool { return h.WALStatus == "lost" || h.InvalidationReason != "" }

// HumanBytes prints a size in bytes with a binary unit: "512 B", "1.5 MiB".
func HumanBytes(b uint64) string {
	if b < 1024 {
		return fmt.Sprintf("%d B", b)
	}
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB"}
	v, u := float64(b)/1024, 0
	for v >= 1024 && u < len(units)-1 {
		v, u = v/1024, u+1
	}
	return fmt.Sprintf("%.1f %s", v, units[u])
}
