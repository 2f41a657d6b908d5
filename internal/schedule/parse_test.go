package schedule

import "testing"

func TestParseSchedule(t *testing.T) {
	for _, spec := range []string{"0 3 * * *", "*/5 * * * * *", "@daily", "@every 6h", "CRON_TZ=UTC 30 2 * * 1-5"} {
		if s, err := Parse(spec); err != nil || s == nil {
			t.Errorf("Parse(%q) = %v, %v", spec, s, err)
		}
	}
	for _, spec := range []string{"bogus", "61 * * * *", "@fortnightly"} {
		if _, err := Parse(spec); err == nil {
			t.Errorf("Parse(%q) accepted", spec)
		}
	}
	if s, err := Parse(""); s != nil || err != nil {
		t.Errorf(`Parse("") = %v, %v; want no schedule`, s, err)
	}
}
