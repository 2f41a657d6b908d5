package schedule

import (
	"fmt"

	"github.com/robfig/cron/v3"
)

// Parse reads a schedule spec (--backfill-schedule, --verify-schedule, --snapshot-schedule): the
// standard 5-field cron spec (minute hour day-of-month month day-of-week), an optional leading
// seconds field, and descriptors such as @daily, @hourly or @every 10m
// (github.com/robfig/cron/v3). Times are in the daemon's local time zone unless the spec starts
// with CRON_TZ=Zone. "" means no schedule (nil); the error names the spec and the accepted forms.
func Parse(spec string) (cron.Schedule, error) {
	if spec == "" {
		return nil, nil
	}
	p := cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
	s, err := p.Parse(spec)
	if err != nil {
		return nil, fmt.Errorf("schedule %q: %w (use a cron spec such as \"0 3 * * *\", or @daily, @every 6h)", spec, err)
	}
	return s, nil
}
