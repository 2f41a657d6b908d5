-- pgconverge metadata schema, version 9: tables retired on purpose.

-- retired_at: when `pgconverge retire` recorded that no stream is to follow the table any more
-- (its target copy stays as of its last watermark); NULL for a table meant to be followed. The
-- coverage report calls a table no stream follows 'retired' when it is set, else 'not-streamed',
-- which counts as a gap. A run that selects the table again clears it and loads the table again.
alter table pgconverge.tables add column retired_at timestamptz;
