// Parse a Jenkinsfile with Groovy's own compiler and print its method calls as JSON.
//
// Usage: groovy pipeline_calls.groovy Jenkinsfile
//
// The file is compiled to the CONVERSION phase (syntax checked, AST built, no
// class resolution), so a syntax error exits non-zero with the compiler's
// message, and the pipeline DSL's names (pipeline, agent, sh, ...) need no
// Jenkins.  Each call is printed as one JSON object:
//   {"name": "sh", "within": ["pipeline", "stages", "stage", "steps"],
//    "stage": "Test", "args": [".venv/bin/python -m pytest ..."], "named": {}}
// "args" holds the text of constant and GString arguments (closures are left
// out); "named" holds named arguments such as timeout(time: 90, unit: 'MINUTES').

import groovy.json.JsonOutput
import org.codehaus.groovy.ast.CodeVisitorSupport
import org.codehaus.groovy.ast.expr.ClosureExpression
import org.codehaus.groovy.ast.expr.ConstantExpression
import org.codehaus.groovy.ast.expr.Expression
import org.codehaus.groovy.ast.expr.GStringExpression
import org.codehaus.groovy.ast.expr.MapExpression
import org.codehaus.groovy.ast.expr.MethodCallExpression
import org.codehaus.groovy.ast.expr.TupleExpression
import org.codehaus.groovy.ast.expr.VariableExpression
import org.codehaus.groovy.control.CompilationUnit
import org.codehaus.groovy.control.Phases

class CallCollector extends CodeVisitorSupport {
    List calls = []
    List within = []
    List stages = []

    static String text(Expression e) {
        if (e instanceof ConstantExpression) return String.valueOf(e.value)
        if (e instanceof GStringExpression) return e.text
        if (e instanceof VariableExpression) return e.name
        return e.text
    }

    void visitMethodCallExpression(MethodCallExpression call) {
        String name = call.methodAsString
        List args = []
        Map named = [:]
        Expression arguments = call.arguments
        List items = arguments instanceof TupleExpression ? arguments.expressions : [arguments]
        items.each { Expression item ->
            if (item instanceof MapExpression) {
                item.mapEntryExpressions.each { named[text(it.keyExpression)] = text(it.valueExpression) }
            } else if (!(item instanceof ClosureExpression)) {
                args << text(item)
            }
        }
        calls << [name: name, within: within.clone(), stage: stages ? stages[-1] : null, args: args, named: named]
        within.push(name)
        if (name == 'stage') stages.push(args ? args[0] : null)
        super.visitMethodCallExpression(call)
        if (name == 'stage') stages.pop()
        within.pop()
    }
}

if (args.length != 1) {
    System.err.println('usage: groovy pipeline_calls.groovy JENKINSFILE')
    System.exit(2)
}
def unit = new CompilationUnit()
unit.addSource(new File(args[0]))
unit.compile(Phases.CONVERSION)
def collector = new CallCollector()
unit.AST.modules.each { it.statementBlock.visit(collector) }
collector.calls.each { println JsonOutput.toJson(it) }
