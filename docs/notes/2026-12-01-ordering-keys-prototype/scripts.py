"""Writes the pgbench scripts of the keyed-drain prototypes into OUT.

Usage: scripts.py REPO OUT. Each script is built from the statements the
store sends (gen/inbox.sql.go and the raw-SQL baseline
internal/bench/pgbench/inbox_claim_complete.pgbench), so that the variants
differ only where the design differs:

  U   the unkeyed baseline, as it is (written by run.sh, not here)
  K0  keyed, today's statements: Claim, then Complete, KeyLock and
      KeyAdvance in one transaction
  K1  promoted heads kept out of the messages table: KeyAdvance inserts
      each successor into inbox_ready_heads instead of updating it, and
      the claim deletes from that table and updates the message once
  K2  K0, but KeyAdvance leases each successor to the completing client
      (no bound: the best case), and the next claim takes only the rest
      of the batch
  K4  K0 without the KeyLock statement (KeyAdvance takes the same locks):
      the most that folding the locks into another statement can save
  K5  K2 without the KeyLock statement: the two gains together

A prototype for measurement only: none of it is the store's code.
"""
import os
import re
import sys

repo, out = sys.argv[1], sys.argv[2]
u=open(os.path.join(repo, 'internal/bench/pgbench/inbox_claim_complete.pgbench')).read()
claim_start=u.index('WITH ready AS')
claim_end=u.index('\n\\gset\n')+1
claim=u[claim_start:claim_end]
comp_start=u.index('WITH input AS')
comp_end=u.index('\\endif')
complete=u[comp_start:comp_end].rstrip().rstrip(';')
gen=open(os.path.join(repo, 'gen/inbox.sql.go')).read()
def const(name):
    i=gen.index('const %s = `'%name)
    j=gen.index('`',i)
    s=gen[j+1:gen.index('`',j+1)]
    s=s.split('\n',1)[1]
    return s.strip().rstrip(';')
keylock=const('inboxKeyLock').replace('$1::text[]',':ids::text[]')
keyadv=const('inboxKeyAdvance').replace('$1::text[]',':ids::text[]').replace('$2::timestamptz','NULL::timestamptz')
K0=claim+'\\gset\n\\if :n > 0\nBEGIN;\n'+complete+';\n'+keylock+';\n'+keyadv+';\nCOMMIT;\n\\endif\n'
open(os.path.join(out, 'K0.pgbench'), 'w').write(K0)
m=re.search(r'claimed AS \(\n    UPDATE inbox_messages AS m\n(.*?)\n    FROM picked\n\s*WHERE m.message_id = picked.message_id\n\s*AND picked.unclaimable IS NULL\n\s*RETURNING (.*?)picked.due_at\n\)', claim, re.S)
assert m, 'the claim statement changed shape: update scripts.py'
setlist, returning = m.group(1), m.group(2)
pclaim='''WITH picked AS (
    SELECT h.message_id, h.created_at AS due_at
    FROM inbox_ready_heads AS h
    ORDER BY h.created_at, h.message_id
    LIMIT :batch::integer
    FOR UPDATE SKIP LOCKED
), taken AS (
    DELETE FROM inbox_ready_heads AS h
    USING picked AS p
    WHERE h.message_id = p.message_id
    RETURNING h.message_id, p.due_at
), claimed AS (
    UPDATE inbox_messages AS m
'''+setlist+'''
    FROM taken AS picked
    WHERE m.message_id = picked.message_id
      AND m.status = 'waiting'
    RETURNING '''+returning+'''picked.due_at
)
SELECT count(*) AS n,
       array_agg(message_id ORDER BY created_at, message_id)::text AS ids,
       array_agg(lease_generation ORDER BY created_at, message_id)::text AS gens
FROM claimed
'''
padv=keyadv
i=padv.index('), promoted AS (')
j=padv.index('), headed AS (')
padv=padv[:i]+'''), promoted AS (
    INSERT INTO inbox_ready_heads (message_id, created_at, tenant_id, ordering_key)
    SELECT m.message_id, m.created_at, coalesce(m.tenant_id, ''), m.ordering_key
    FROM next AS n
    JOIN inbox_messages AS m ON m.message_id = n.message_id
    RETURNING message_id, tenant_id, ordering_key
'''+padv[j:]
K1=pclaim+'\\gset\n\\if :n > 0\nBEGIN;\n'+complete+';\n'+keylock+';\n'+padv+';\nCOMMIT;\n\\endif\n'
open(os.path.join(out, 'K1.pgbench'), 'w').write(K1)

# K2: affinity. The completing transaction leases each finished head's
# successor to the same owner (unbounded: the best case); the next claim
# takes only what is left of the batch from the ready index.
claim2=claim.replace('LIMIT :batch::integer', 'LIMIT (:batch::integer - :cn::integer)')
claim2=claim2.replace('''SELECT count(*) AS n,
       array_agg(message_id ORDER BY created_at, message_id)::text AS ids,
       array_agg(lease_generation ORDER BY created_at, message_id)::text AS gens
FROM claimed''','''SELECT count(*) + :cn::integer AS n,
       (:cids::text[] || coalesce(array_agg(message_id::text ORDER BY created_at, message_id), '{}'))::text AS ids,
       (:cgens::bigint[] || coalesce(array_agg(lease_generation ORDER BY created_at, message_id), '{}'))::text AS gens
FROM claimed''')
assert claim2.count(':cn::integer')==4
m=re.search(r'claimed AS \(\n    UPDATE inbox_messages AS m\n    SET (.*?)\n    FROM picked', claim, re.S)
assert m, 'the claim statement changed shape: update scripts.py'
sets=m.group(1)
adv2=keyadv
i=adv2.index('), promoted AS (')
j=adv2.index('), headed AS (')
adv2=adv2[:i]+'''), promoted AS (
    UPDATE inbox_messages AS m
    SET '''+sets+'''
    FROM next AS n
    WHERE m.message_id = n.message_id
    RETURNING m.message_id, coalesce(m.tenant_id, '') AS tenant_id, m.ordering_key, m.lease_generation, m.created_at
'''+adv2[j:]
adv2=adv2.replace('''SELECT (SELECT count(*) FROM headed)::bigint AS promoted, (SELECT count(*) FROM emptied)::bigint AS emptied''','''SELECT (SELECT count(*) FROM headed)::bigint AS cn,
       (SELECT coalesce(array_agg(message_id::text ORDER BY created_at, message_id), '{}') FROM promoted)::text AS cids,
       (SELECT coalesce(array_agg(lease_generation ORDER BY created_at, message_id), '{}') FROM promoted)::text AS cgens''')
assert 'AS cgens' in adv2
# After a claim that found nothing, nothing is carried to the next one.
reset = "\\else\nSELECT 0 AS cn, '{}' AS cids, '{}' AS cgens\n\\gset\n\\endif\n"
K2=claim2+'\\gset\n\\if :n > 0\nBEGIN;\n'+complete+';\n'+keylock+';\n'+adv2+'\n\\gset\nCOMMIT;\n'+reset
open(os.path.join(out, 'K2.pgbench'), 'w').write(K2)

# K4: K0 without the KeyLock statement (KeyAdvance's freed takes the same
# locks): what folding the locks into another statement could save at most.
K4=claim+'\\gset\n\\if :n > 0\nBEGIN;\n'+complete+';\n'+keyadv+';\nCOMMIT;\n\\endif\n'
open(os.path.join(out, 'K4.pgbench'), 'w').write(K4)

# K5: K2 without the KeyLock statement: the two gains together.
K5=claim2+'\\gset\n\\if :n > 0\nBEGIN;\n'+complete+';\n'+adv2+'\n\\gset\nCOMMIT;\n'+reset
open(os.path.join(out, 'K5.pgbench'), 'w').write(K5)
