"""pg_cdc's background processes run as a superuser: a function or aggregate a role planted in a schema on
their search_path must never run in them. With the default path ("$user", public), an aggregate
public.jsonb_agg(jsonb) is a closer match than pg_catalog's jsonb_agg(anyelement) for the calls the worker
and the launcher make at every pass, so it ran as the superuser (found while building the cdc_admin role).
The processes now run with search_path = pg_catalog, pg_temp and name every other object by its schema.

Oracle: the planted aggregate writes who ran it into a table; nothing of pg_cdc may appear there while a
sink is working. The aggregate is planted for a few seconds only, in a module of its own."""
import time

from conftest import connect, wait_for

PLANTER = "cdc_e2e_planter"


def test_a_function_planted_in_public_never_runs_in_the_worker(pg, sinks, unique):
    t = f"sp_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    sinks.add(f"sp_{unique}", f"sp-{unique}", tables=[t])
    pg.execute(f"INSERT INTO {t} VALUES (1)")
    wait_for(lambda: pg.execute("SELECT coalesce(sum(events_published), 0) FROM _cdc_offsets WHERE sink_name = %s",
                                (f"sp_{unique}",)).fetchone()[0] == 1, timeout=60, what="the sink delivering")
    if not pg.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (PLANTER,)).fetchone():
        pg.execute(f"CREATE ROLE {PLANTER} NOLOGIN")
    pg.execute(f"GRANT CREATE ON SCHEMA public TO {PLANTER}")
    try:
        with connect() as c:
            c.execute(f"SET ROLE {PLANTER}")
            c.execute("CREATE TABLE public.cdc_planted_log (app text, who text, su text)")
            c.execute("GRANT INSERT ON public.cdc_planted_log TO PUBLIC")
            c.execute("""CREATE FUNCTION public.cdc_planted_step(s jsonb, v jsonb) RETURNS jsonb LANGUAGE sql AS $$
                           INSERT INTO public.cdc_planted_log
                           VALUES (current_setting('application_name'), current_user, current_setting('is_superuser'))
                           RETURNING coalesce(s, '[]'::jsonb) || jsonb_build_array(v) $$""")
            c.execute("CREATE AGGREGATE public.jsonb_agg(jsonb) (sfunc = public.cdc_planted_step, stype = jsonb)")
            # Positive control: the aggregate is found by a session with the default search_path.
            c.execute("RESET ROLE")
            c.execute("SELECT jsonb_agg(x) FROM (VALUES ('1'::jsonb)) v(x)")
            assert c.execute("SELECT count(*) FROM public.cdc_planted_log").fetchone()[0] == 1
            c.execute("TRUNCATE public.cdc_planted_log")
            # The sink keeps working (its worker and the launcher pass many times meanwhile).
            pg.execute(f"INSERT INTO {t} VALUES (2)")
            wait_for(lambda: pg.execute("SELECT sum(events_published) FROM _cdc_offsets WHERE sink_name = %s",
                                        (f"sp_{unique}",)).fetchone()[0] == 2, timeout=60, what="the next event")
            time.sleep(2)
            ran = c.execute("SELECT DISTINCT app, who, su FROM public.cdc_planted_log ORDER BY 1").fetchall()
            assert ran == [], f"the planted aggregate ran in: {ran}"
    finally:
        with connect() as c:
            c.execute("DROP AGGREGATE IF EXISTS public.jsonb_agg(jsonb)")
            c.execute("DROP FUNCTION IF EXISTS public.cdc_planted_step(jsonb, jsonb)")
            c.execute("DROP TABLE IF EXISTS public.cdc_planted_log")
            c.execute(f"REVOKE CREATE ON SCHEMA public FROM {PLANTER}")
            c.execute(f"DROP ROLE IF EXISTS {PLANTER}")
        pg.execute("SELECT cdc_disable(%s)", (t,))
