package engine

import (
	"context"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
)

// ReadSlotHealth returns the health of slot name on src as the source describes it (cdc.ReadSlot,
// cdc.MaxSlotWALKeepSize), assessed (coverage.SlotHealth.Assess); now is the source's current
// WAL position, from which the restart lag is measured in bytes.
func ReadSlotHealth(ctx context.Context, src *pgx.Conn, name string, now pglogrepl.LSN) (coverage.SlotHealth, error) {
	h := coverage.SlotHealth{Name: name}
	var err error
	if h.MaxSlotWALKeepSizeBytes, err = cdc.MaxSlotWALKeepSize(ctx, src); err != nil {
		return h, err
	}
	s, err := cdc.ReadSlot(ctx, src, name)
	if err != nil {
		return h, err
	}
	h.Exists = s.Exists && s.ThisDatabase
	if h.Exists {
		h.Plugin, h.Active, h.WALStatus, h.SafeWALSizeBytes = s.Plugin, s.ActivePID != 0, s.WALStatus, s.SafeWALSize
		h.InvalidationReason = s.InvalidationReason
		if s.RestartLSN != 0 {
			r := coverage.LSN(s.RestartLSN)
			h.RestartLSN = &r
			if now > s.RestartLSN {
				h.RestartLagBytes = uint64(now - s.RestartLSN)
			}
		}
		if s.ConfirmedFlush != 0 {
			c := coverage.LSN(s.ConfirmedFlush)
			h.ConfirmedFlushLSN = &c
		}
	}
	h.Assess()
	return h, nil
}
