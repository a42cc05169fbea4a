-- A key's newest instance, for a wait by key once no instance holds the key (the holder
-- finished and its scope freed the key). Without it that lookup read the whole table.
-- Partial: rows inserted without a key pay nothing. On a large table the build blocks
-- writes to gd_instances for its duration (CREATE INDEX; a migration runs in a transaction).
CREATE INDEX gd_instances_key ON gd_instances (unique_key, id) WHERE unique_key IS NOT NULL;
