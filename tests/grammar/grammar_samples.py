"""Lark grammars shared by the grammar tests (SQL and arithmetic copied from ../shared/bench/grammar_peers.py)."""

JSON_LARK = r"""
?start: value
?value: object | array | STRING | NUMBER | "true" | "false" | "null"
array: "[" [value ("," value)*] "]"
object: "{" [pair ("," pair)*] "}"
pair: STRING ":" value
STRING: /"([^"\\\x00-\x1f]|\\["\\\/bfnrt]|\\u[0-9a-fA-F]{4})*"/
NUMBER: /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/
%ignore /[ \t\n\r]+/
"""

SQL_LARK = r"""
start: select_stmt ";"?
select_stmt: "SELECT" select_list "FROM" table_ref join* where_clause? group_by? order_by? limit_clause?
select_list: "*" | select_item ("," select_item)*
select_item: expr ("AS" NAME)?
table_ref: NAME ("AS" NAME)?
join: ("INNER" | "LEFT")? "JOIN" table_ref "ON" condition
where_clause: "WHERE" condition
group_by: "GROUP" "BY" column ("," column)*
order_by: "ORDER" "BY" order_item ("," order_item)*
order_item: expr ("ASC" | "DESC")?
limit_clause: "LIMIT" INT
condition: condition "OR" and_cond | and_cond
and_cond: and_cond "AND" predicate | predicate
predicate: expr COMP_OP expr
         | expr "IN" "(" expr ("," expr)* ")"
         | expr "IS" "NOT"? "NULL"
         | expr "BETWEEN" expr "AND" expr
         | expr "LIKE" STRING
         | "(" condition ")"
expr: expr ADD_OP term | term
term: term MUL_OP factor | factor
factor: column | NUMBER | STRING | func_call | "(" expr ")"
func_call: NAME "(" ("*" | expr ("," expr)*) ")"
column: NAME ("." NAME)?
COMP_OP: "=" | "!=" | "<>" | "<=" | ">=" | "<" | ">"
ADD_OP: "+" | "-"
MUL_OP: "*" | "/"
NAME: /[a-zA-Z_][a-zA-Z0-9_]*/
NUMBER: /[0-9]+(\.[0-9]+)?/
INT: /[0-9]+/
STRING: /'[^']*'/
%import common.WS
%ignore WS
"""

ARITH_LARK = r"""
start: expr
expr: expr "+" term | expr "-" term | term
term: term "*" factor | term "/" factor | factor
factor: "-" factor | atom "^" factor | atom
atom: NUMBER | NAME "(" expr ("," expr)* ")" | NAME | "(" expr ")"
NUMBER: /[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?/
NAME: /[a-z_][a-z0-9_]*/
%ignore /[ \t]+/
"""

SQL_DOC = """SELECT c.customer_id, c.name AS customer_name, COUNT(o.order_id) AS n_orders,
       SUM(o.total_cents) / 100 AS revenue, MAX(o.created_at) AS last_order
FROM customers AS c
LEFT JOIN orders AS o ON o.customer_id = c.customer_id AND o.status != 'cancelled'
INNER JOIN regions AS r ON r.region_id = c.region_id
WHERE (c.created_at >= '2024-01-01' OR c.vip = 1)
  AND r.name IN ('EMEA', 'APAC', 'NA')
  AND c.email IS NOT NULL
  AND o.total_cents BETWEEN 500 AND 250000
  AND c.name LIKE 'A%'
GROUP BY c.customer_id, c.name
ORDER BY revenue DESC, n_orders ASC, c.name
LIMIT 50;"""

ARITH_DOC = ('(-b + sqrt(b ^ 2 - 4 * a * c)) / (2 * a) - max(1.5e3, min(x_1, y_2 * (3.25 - z)), -(k / 7)) * ((((w '
             '+ 1) * (w - 1)) / (w ^ 2 + 0.001)) - log(abs(theta) + 1e-9)) + f(g(h(1, 2), 3), (4 + 5) * 6 - 7 / 8)'
             ' ^ 2')

JSON_DOC = """{"sku": "TRL-0421", "name": "Trail \u00e9 \u6771", "price": {"amount": 12999, "currency": "EUR"},
 "tags": ["running", "trail"], "variants": [{"id": 1001, "size": "M", "dims": {"w": 310.5e-1}}], "ok": true,
 "none": null, "neg": -0.5, "empty": {}, "list": []}"""

GRAMMARS = {"json": JSON_LARK, "sql": SQL_LARK, "arith": ARITH_LARK}
DOCS = {"json": JSON_DOC, "sql": SQL_DOC, "arith": ARITH_DOC}
