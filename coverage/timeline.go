package coverage

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// ReadTimeline returns the source timeline slot's latest session streamed from
// (pgconverge.source_timelines); known is false when none was recorded (a target older than the
// record, or a slot that never streamed).
func ReadTimeline(ctx context.Context, db DB, slot string) (timeline int64, known bool, err error) {
	err = db.QueryRow(ctx, `select timeline from pgconverge.source_timelines where slot = $1`, slot).Scan(&timeline)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("read the source timeline of slot %q: %w", slot, err)
	}
	return timeline, true, nil
}

// RecordTimeline records that slot's session streams from source timeline timeline.
func RecordTimeline(ctx context.Context, db DB, slot string, timeline int64) error {
	_, err := db.Exec(ctx, `insert into pgconverge.source_timelines (slot, timeline) values ($1, $2)
on conflict (slot) do update set timeline = excluded.timeline, recorded_at = now()`, slot, timeline)
	if err != nil {
		return fmt.Errorf("record the source timeline of slot %q: %w", slot, err)
	}
	return nil
}

// TimelineEnd returns the LSN at which timeline left the history of the server whose timeline
// history file is history (TIMELINE_HISTORY, PostgreSQL docs §26.2.5 and §55.4: one line per
// earlier timeline, "parentTLI<TAB>switchpoint<TAB>reason", comments starting with #): the
// switch point of the line of timeline. found is false when the history does not name it (the
// server does not descend from it).
func TimelineEnd(history string, timeline int64) (end pglogrepl.LSN, found bool, err error) {
	for _, line := range strings.Split(history, "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		tli, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return 0, false, fmt.Errorf("timeline history line %q: %w", line, err)
		}
		if tli != timeline {
			continue
		}
		if end, err = pglogrepl.ParseLSN(fields[1]); err != nil {
			return 0, false, fmt.Errorf("timeline history line %q: %w", line, err)
		}
		return end, true, nil
	}
	return 0, false, nil
}
