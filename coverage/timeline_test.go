package coverage

import (
	"testing"

	"github.com/jackc/pglogrepl"
)

func TestTimelineEnd(t *testing.T) {
	// A timeline 3 history file, as TIMELINE_HISTORY 3 returns it.
	history := "1\t0/3000158\tno recovery target specified\n\n2\t0/5A00000\tat restore point \"x\"\n"
	for _, c := range []struct {
		timeline int64
		end      pglogrepl.LSN
		found    bool
	}{{1, 0x3000158, true}, {2, 0x5A00000, true}, {3, 0, false}, {4, 0, false}} {
		end, found, err := TimelineEnd(history, c.timeline)
		if err != nil || end != c.end || found != c.found {
			t.Errorf("TimelineEnd(%d) = %s, %v, %v; want %s, %v, nil", c.timeline, end, found, err, c.end, c.found)
		}
	}
	if _, _, err := TimelineEnd("x\t0/1\treason\n", 1); err == nil {
		t.Error("TimelineEnd of a malformed line: no error")
	}
}
