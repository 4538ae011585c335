-- UseGenericPlans makes the statements that follow in the current
-- transaction reuse the generic plan of their prepared statement instead of
-- planning again for every call's parameter values. The store sends it
-- first in the same round trip and implicit transaction as its claim and
-- complete statements, whose generic plans are the same index plans as
-- their custom ones (leasectl doctor explains both). is_local = true: the
-- setting ends with the transaction and never reaches the caller's session.
-- name: UseGenericPlans :exec
SELECT set_config('plan_cache_mode', 'force_generic_plan', true);

